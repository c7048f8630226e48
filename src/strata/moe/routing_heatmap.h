// The routing heatmap as a standalone SVG (calibrate --plot, routing-stats --plot): one row per layer,
// one cell per expert, coloured by how often the router picked it relative to the layer's most picked
// expert, with the colour scale drawn below. The same picture as the experts view of serve's web page
// (webui/app.js uses the same colour stops), so a profile can be looked at without a server.
#pragma once

#include <string>

#include "strata/engine/routing_counts.h"
#include "strata/engine/routing_trace.h"

namespace strata {

// The colour of v in [0, 1] (clamped) as "#rrggbb".
std::string heat_colour(double v);

// The SVG document for `counts` (fails when the table is empty); `title` is its heading.
std::string routing_heatmap_svg(const RoutingCounts& counts, const std::string& title);

// The counts a trace's picks add up to (every stream, every token), to plot a trace.
RoutingCounts routing_trace_counts(const RoutingTrace& trace);

// Writes it to `path`, refusing a name that does not end in .svg (a likely slip for the profile's
// .json) and failing with the path when it cannot be written.
void write_routing_heatmap(const std::string& path, const RoutingCounts& counts, const std::string& title);

}  // namespace strata
