// The draft tree of a block drafter (DDTree, Ringel & Romano 2026): a drafter that proposes a whole block
// in one forward gives a distribution for each position of the block; taking the positions as
// independent, a path's score is the product of its tokens' probabilities at their depths, and the tree
// under a node budget is the set of the `budget` best-scoring paths. It is prefix-closed (a prefix scores
// at least as much as the path), so it grows best-first: a heap of candidates, where a node taken
// offers its first child (the next position's best token) and its next sibling (its own position's next
// token). Verification then checks the whole tree in one forward (Sequence::forward_pending).
#pragma once

#include <cstdint>
#include <vector>

#include "strata/engine/drafter.h"

namespace strata {

// The tree of the `budget` best paths over positions[0..] (position d gives depth d's tokens) into out
// (tokens, parents: children of the last kept token have parent -1; q empty). Nodes come in decreasing
// score, so a parent precedes its children and a node's children are in decreasing probability, which
// is the order verification tries them in. Equal scores keep the earlier-offered candidate first. Fails
// (strata::Error) on candidates that break the contract above.
void build_ddtree(const std::vector<PositionCandidates>& positions, int budget, Draft& out);

}  // namespace strata
