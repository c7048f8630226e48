#include "strata/moe/routing_heatmap.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "strata/base/error.h"

namespace strata {
namespace {

struct Stop {
  double at;
  int r, g, b;
};
// Dark blue, blue, orange, yellow: kept in step with HEAT_STOPS in webui/app.js.
constexpr Stop kStops[] = {{0, 13, 27, 42}, {0.35, 31, 78, 121}, {0.7, 194, 65, 12}, {1, 250, 204, 21}};

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

std::string heat_colour(double v) {
  v = std::isnan(v) ? 0.0 : std::clamp(v, 0.0, 1.0);
  const Stop* hi = &kStops[1];
  while (hi->at < v && hi != &kStops[std::size(kStops) - 1]) ++hi;
  const Stop* lo = hi - 1;
  const double t = (v - lo->at) / (hi->at - lo->at);
  const auto mix = [t](int a, int b) { return static_cast<int>(std::lround(a + t * (b - a))); };
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", mix(lo->r, hi->r), mix(lo->g, hi->g), mix(lo->b, hi->b));
  return buf;
}

std::string routing_heatmap_svg(const RoutingCounts& counts, const std::string& title) {
  if (counts.empty() || counts.n_layer < 1 || counts.n_expert < 1) fail("routing heatmap: no routing counts to plot");
  // Cells shrink with many experts so that a wide model still fits a screen.
  const int cell_w = std::clamp(1200 / counts.n_expert, 3, 16), cell_h = 12, gap = 1;
  const int left = 44, top = 40, scale_h = 12;
  const int grid_w = counts.n_expert * (cell_w + gap), grid_h = counts.n_layer * (cell_h + gap);
  const int width = left + std::max(grid_w, 320) + 16, height = top + grid_h + 24 + scale_h + 24;
  std::string s;
  s += cat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", width, "\" height=\"", height, "\" viewBox=\"0 0 ",
           width, " ", height, "\" font-family=\"sans-serif\" font-size=\"10\">\n");
  s += cat("<title>", xml_escape(title), "</title>\n");
  s += cat("<rect width=\"", width, "\" height=\"", height, "\" fill=\"#111418\"/>\n");
  s += cat("<text x=\"", left, "\" y=\"16\" fill=\"#e4e7eb\" font-size=\"13\">", xml_escape(title), "</text>\n");
  s += cat("<text x=\"", left, "\" y=\"31\" fill=\"#8b949e\">", counts.n_layer, " layers x ", counts.n_expert,
           " experts, ", counts.n_tokens, " tokens; colour: picks relative to the layer's most picked expert</text>\n");
  s += "<g class=\"heatmap\">\n";
  for (int l = 0; l < counts.n_layer; ++l) {
    const int y = top + l * (cell_h + gap);
    uint64_t most = 0;
    for (int e = 0; e < counts.n_expert; ++e) most = std::max(most, counts.at(l, e));
    s += cat("<g class=\"layer\" data-layer=\"", l, "\"><text x=\"", left - 6, "\" y=\"", y + cell_h - 2,
             "\" fill=\"#8b949e\" text-anchor=\"end\">", l, "</text>\n");
    for (int e = 0; e < counts.n_expert; ++e) {
      const uint64_t n = counts.at(l, e);
      const double v = most > 0 ? static_cast<double>(n) / static_cast<double>(most) : 0.0;
      s += cat("<rect class=\"cell\" data-expert=\"", e, "\" x=\"", left + e * (cell_w + gap), "\" y=\"", y,
               "\" width=\"", cell_w, "\" height=\"", cell_h, "\" fill=\"", heat_colour(v), "\"><title>layer ", l,
               ", expert ", e, ": ", n, " picks</title></rect>\n");
    }
    s += "</g>\n";
  }
  s += "</g>\n";
  // The colour scale: the stops as a gradient, 0 and 1 at its ends.
  const int sy = top + grid_h + 16;
  s += "<g class=\"scale\">\n<defs><linearGradient id=\"heat\" x1=\"0\" x2=\"1\" y1=\"0\" y2=\"0\">";
  for (const Stop& st : kStops) s += cat("<stop offset=\"", st.at, "\" stop-color=\"", heat_colour(st.at), "\"/>");
  s += "</linearGradient></defs>\n";
  s += cat("<rect x=\"", left, "\" y=\"", sy, "\" width=\"200\" height=\"", scale_h, "\" fill=\"url(#heat)\"/>\n");
  s += cat("<text x=\"", left, "\" y=\"", sy + scale_h + 12, "\" fill=\"#8b949e\">0</text>\n");
  s += cat("<text x=\"", left + 200, "\" y=\"", sy + scale_h + 12, "\" fill=\"#8b949e\" text-anchor=\"end\">1 (the layer's most picked)</text>\n");
  s += "</g>\n</svg>\n";
  return s;
}

RoutingCounts routing_trace_counts(const RoutingTrace& trace) {
  const RoutingTraceHeader& h = trace.header;
  RoutingCounts c;
  c.reset(h.n_layer, h.n_expert);
  const size_t stride = trace.token_stride(), k = static_cast<size_t>(h.k);
  for (const RoutingStream& st : trace.streams) {
    const size_t tokens = stride ? st.picks.size() / stride : 0;
    for (size_t t = 0; t < tokens; ++t)
      for (int l = 0; l < h.n_layer; ++l)
        for (size_t j = 0; j < k; ++j) c.add(l, st.picks[t * stride + static_cast<size_t>(l) * k + j]);
    c.n_tokens += tokens;
  }
  return c;
}

void write_routing_heatmap(const std::string& path, const RoutingCounts& counts, const std::string& title) {
  if (path.size() < 5 || path.compare(path.size() - 4, 4, ".svg") != 0)
    fail("--plot: the heatmap is an SVG file; give a name ending in .svg, got '", path, "'");
  const std::string svg = routing_heatmap_svg(counts, title);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail("--plot: cannot write ", path);
  f << svg;
  f.close();
  if (!f) fail("--plot: cannot write ", path);
}

}  // namespace strata
