#include "strata/grammar/grammar.h"

#include <algorithm>
#include <cstring>

#include "strata/base/error.h"

namespace strata::grammar {

namespace {
// Stacks alive at once: beyond it the grammar is too ambiguous to follow (each byte would cost more
// than a decode step).
constexpr size_t kMaxStacks = 4096;
}  // namespace

uint32_t Grammar::add_rule(std::string name) {
  if (finished_) fail("grammar: rule '", name, "' added after finish()");
  rules_.push_back(Rule{std::move(name), {}});
  return static_cast<uint32_t>(rules_.size() - 1);
}

void Grammar::add_alt(uint32_t rule, Sequence seq) {
  if (finished_) fail("grammar: alternative added after finish()");
  rules_.at(rule).alts.push_back(std::move(seq));
}

uint32_t Grammar::rule(std::string name, std::vector<Sequence> alts) {
  const uint32_t id = add_rule(std::move(name));
  for (Sequence& s : alts) add_alt(id, std::move(s));
  return id;
}

Element Grammar::bytes(const ByteSet& set) {
  for (size_t i = 0; i < sets_.size(); ++i)
    if (sets_[i] == set) return Element{Element::Kind::Bytes, static_cast<uint32_t>(i), 0, 0};
  sets_.push_back(set);
  return Element{Element::Kind::Bytes, static_cast<uint32_t>(sets_.size() - 1), 0, 0};
}

Element Grammar::byte(uint8_t b) {
  ByteSet s;
  s.add(b);
  return bytes(s);
}

void Grammar::append_literal(Sequence& seq, std::string_view text) {
  for (char c : text) seq.push_back(byte(static_cast<uint8_t>(c)));
}

void Grammar::finish() {
  if (finished_) return;
  const size_t n = rules_.size();
  if (root_ >= n) fail("grammar: the root rule ", root_, " does not exist");
  for (const Rule& r : rules_) {
    if (r.alts.empty()) fail("grammar: rule '", r.name, "' has no alternative");
    for (const Sequence& s : r.alts)
      for (const Element& e : s) {
        if (e.kind == Element::Kind::Bytes && e.index >= sets_.size()) fail("grammar: rule '", r.name, "' names a missing byte set");
        if (e.kind != Element::Kind::Bytes && e.index >= n) fail("grammar: rule '", r.name, "' calls a missing rule");
        if (e.kind == Element::Kind::Repeat && (e.max < e.min || e.max == 0))
          fail("grammar: rule '", r.name, "' repeats '", rules_[e.index].name, "' between ", e.min, " and ", e.max, " times");
      }
  }

  // Which rules can match nothing (a fixed point).
  std::vector<bool> nullable(n, false);
  auto elem_nullable = [&](const Element& e) {
    if (e.kind == Element::Kind::Bytes) return false;
    if (e.kind == Element::Kind::Call) return static_cast<bool>(nullable[e.index]);
    return e.min == 0 || nullable[e.index];
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const Sequence& s : rules_[r].alts)
        if (std::all_of(s.begin(), s.end(), elem_nullable)) {
          nullable[r] = true;
          changed = true;
          break;
        }
    }
  }
  for (const Rule& r : rules_)
    for (const Sequence& s : r.alts)
      for (const Element& e : s)
        if (e.kind == Element::Kind::Repeat && nullable[e.index])
          fail("grammar: rule '", r.name, "' repeats '", rules_[e.index].name, "', which can match nothing");

  // Left recursion: a rule that calls itself (through others) before any byte is read would make the
  // matcher's stacks grow forever. Depth-first search over "calls before reading a byte".
  std::vector<int> mark(n, 0);  // 0 new, 1 on the path, 2 done
  auto visit = [&](auto&& self, size_t r) -> void {
    mark[r] = 1;
    for (const Sequence& s : rules_[r].alts)
      for (const Element& e : s) {
        if (e.kind == Element::Kind::Bytes) break;
        if (mark[e.index] == 1) fail("grammar: rule '", rules_[e.index].name, "' can reach itself without reading a byte");
        if (mark[e.index] == 0) self(self, e.index);
        if (!elem_nullable(e)) break;
      }
    mark[r] = 2;
  };
  for (size_t r = 0; r < n; ++r)
    if (mark[r] == 0) visit(visit, r);

  // First bytes of every rule (a fixed point), then of every suffix of every alternative.
  std::vector<ByteSet> first(n);
  auto merge = [](ByteSet& into, const ByteSet& from) {
    bool grew = false;
    for (size_t w = 0; w < 4; ++w) {
      const uint64_t v = into.bits[w] | from.bits[w];
      grew = grew || v != into.bits[w];
      into.bits[w] = v;
    }
    return grew;
  };
  auto elem_first = [&](const Element& e) -> const ByteSet& { return e.kind == Element::Kind::Bytes ? sets_[e.index] : first[e.index]; };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r)
      for (const Sequence& s : rules_[r].alts)
        for (const Element& e : s) {
          changed = merge(first[r], elem_first(e)) || changed;
          if (!elem_nullable(e)) break;
        }
  }
  first_.assign(n, {});
  nullable_from_.assign(n, {});
  for (size_t r = 0; r < n; ++r) {
    for (const Sequence& s : rules_[r].alts) {
      std::vector<ByteSet> f(s.size() + 1);
      std::vector<bool> z(s.size() + 1, true);
      for (size_t i = s.size(); i-- > 0;) {
        // A repetition part-way through may stop or go on whatever its minimum: say "may be empty".
        const bool empty_ok = s[i].kind == Element::Kind::Repeat || elem_nullable(s[i]);
        f[i] = elem_first(s[i]);
        if (empty_ok) merge(f[i], f[i + 1]);
        z[i] = empty_ok && z[i + 1];
      }
      first_[r].push_back(std::move(f));
      nullable_from_[r].push_back(std::move(z));
    }
  }
  finished_ = true;
}

std::string MatchState::key() const {
  std::string k;
  k.resize(frames.size() * sizeof(Frame) + ends.size() * sizeof(uint32_t) + sizeof(uint32_t));
  const uint32_t n = static_cast<uint32_t>(ends.size());
  char* p = k.data();
  std::memcpy(p, &n, sizeof n);
  p += sizeof n;
  if (!ends.empty()) std::memcpy(p, ends.data(), ends.size() * sizeof(uint32_t));
  p += ends.size() * sizeof(uint32_t);
  if (!frames.empty()) std::memcpy(p, frames.data(), frames.size() * sizeof(Frame));
  return k;
}

Matcher::Matcher(const Grammar& g) : g_(&g) {
  if (!g.finished()) fail("grammar: finish() the grammar before matching it");
  // The start: one stack per alternative of the root, at its first element.
  for (uint32_t a = 0; a < g.rules()[g.root()].alts.size(); ++a) {
    state_.frames.push_back(Frame{g.root(), a, 0, 0});
    state_.ends.push_back(static_cast<uint32_t>(state_.frames.size()));
  }
}

std::vector<Frame>& Matcher::work(int depth) {
  if (work_.size() <= static_cast<size_t>(depth)) work_.resize(static_cast<size_t>(depth) + 1);
  return work_[static_cast<size_t>(depth)];
}

std::vector<Matcher::Branch>& Matcher::branches_at(int depth) {
  if (branches_.size() <= static_cast<size_t>(depth)) branches_.resize(static_cast<size_t>(depth) + 1);
  return branches_[static_cast<size_t>(depth)];
}

bool Matcher::explore(int depth, int want, MatchState* out) {
  const auto& rules = g_->rules();
  while (true) {
    std::vector<Frame>& st = work_[static_cast<size_t>(depth)];
    if (st.empty()) return want < 0;  // the whole grammar matched
    Frame& f = st.back();
    const Sequence& seq = rules[f.rule].alts[f.alt];
    if (f.pos == seq.size()) {  // the rule is done: return to the caller
      st.pop_back();
      if (st.empty()) continue;
      Frame& parent = st.back();
      const Element& pe = rules[parent.rule].alts[parent.alt][parent.pos];
      if (pe.kind != Element::Kind::Repeat) ++parent.pos;
      // Past the minimum of an unbounded repetition the count no longer matters: keep it at the
      // minimum, so equal futures have equal states (and the token masks' cache hits).
      else if (pe.max != kUnbounded || parent.count < pe.min) ++parent.count;
      continue;
    }
    // Nothing from here on can read the byte, and the rest cannot be skipped: a dead end.
    if (want >= 0 && !g_->first_from(f.rule, f.alt, f.pos).has(static_cast<uint8_t>(want)) &&
        !g_->nullable_from(f.rule, f.alt, f.pos)) {
      return false;
    }
    const Element& e = seq[f.pos];
    if (e.kind == Element::Kind::Bytes) {
      if (want < 0 || !g_->set(e.index).has(static_cast<uint8_t>(want))) return false;
      ++f.pos;
      out->frames.insert(out->frames.end(), st.begin(), st.end());
      out->ends.push_back(static_cast<uint32_t>(out->frames.size()));
      if (out->ends.size() > kMaxStacks) fail("grammar: more than ", kMaxStacks, " ways to read the output so far (the schema is too ambiguous)");
      return false;
    }
    // Branches: every alternative of the called rule, and for a repetition also moving past it. All but
    // the last run on a copy one level deeper; the last continues here.
    const uint32_t callee = e.index;
    const bool can_enter = e.kind == Element::Kind::Call || f.count < e.max;
    const bool can_skip = e.kind == Element::Kind::Repeat && f.count >= e.min;
    std::vector<Branch>& branches = branches_at(depth);
    branches.clear();
    if (can_skip) branches.push_back({true, 0});
    if (can_enter) {
      const auto& alts = rules[callee].alts;
      for (uint32_t a = 0; a < alts.size(); ++a) {
        if (want >= 0 && !g_->first_from(callee, a, 0).has(static_cast<uint8_t>(want)) && !g_->nullable_from(callee, a, 0)) continue;
        branches.push_back({false, a});
      }
    }
    const size_t nb = branches.size();
    if (nb == 0) return false;
    auto apply = [&](std::vector<Frame>& s, const Branch& b) {
      if (b.skip) {
        s.back().pos++;
        s.back().count = 0;
      } else {
        s.push_back(Frame{callee, b.alt, 0, 0});
      }
    };
    for (size_t i = 0; i + 1 < nb; ++i) {
      std::vector<Frame>& copy = work(depth + 1);
      const std::vector<Frame>& cur = work_[static_cast<size_t>(depth)];  // work() may have moved it
      copy.assign(cur.begin(), cur.end());
      apply(copy, branches_[static_cast<size_t>(depth)][i]);
      if (explore(depth + 1, want, out) && want < 0) return true;
    }
    apply(work_[static_cast<size_t>(depth)], branches_[static_cast<size_t>(depth)][nb - 1]);
  }
}

void Matcher::step(const MatchState& from, uint8_t b, MatchState& to) {
  to.frames.clear();
  to.ends.clear();
  uint32_t begin = 0;
  for (uint32_t end : from.ends) {
    std::vector<Frame>& st = work(0);
    st.assign(from.frames.begin() + begin, from.frames.begin() + end);
    explore(0, b, &to);
    begin = end;
  }
  if (to.ends.size() < 2) return;
  // Drop repeated stacks (two readings that met again), keeping the first of each.
  MatchState& u = scratch_;
  u.frames.clear();
  u.ends.clear();
  auto range = [](const MatchState& s, size_t i) {
    const uint32_t lo = i == 0 ? 0 : s.ends[i - 1];
    return std::pair<uint32_t, uint32_t>(lo, s.ends[i]);
  };
  for (size_t i = 0; i < to.ends.size(); ++i) {
    const auto [lo, hi] = range(to, i);
    bool seen = false;
    for (size_t j = 0; j < u.ends.size() && !seen; ++j) {
      const auto [ulo, uhi] = range(u, j);
      seen = uhi - ulo == hi - lo && std::equal(to.frames.begin() + lo, to.frames.begin() + hi, u.frames.begin() + ulo);
    }
    if (seen) continue;
    u.frames.insert(u.frames.end(), to.frames.begin() + lo, to.frames.begin() + hi);
    u.ends.push_back(static_cast<uint32_t>(u.frames.size()));
  }
  std::swap(to, u);
}

bool Matcher::advance(uint8_t b) {
  MatchState next;
  step(state_, b, next);
  if (next.dead()) return false;
  state_ = std::move(next);
  return true;
}

bool Matcher::advance(std::string_view bytes) {
  MatchState s = state_;
  MatchState next;
  for (char c : bytes) {
    step(s, static_cast<uint8_t>(c), next);
    if (next.dead()) return false;
    std::swap(s, next);
  }
  state_ = std::move(s);
  return true;
}

bool Matcher::accepting(const MatchState& s) {
  uint32_t begin = 0;
  for (uint32_t end : s.ends) {
    std::vector<Frame>& st = work(0);
    st.assign(s.frames.begin() + begin, s.frames.begin() + end);
    if (explore(0, -1, nullptr)) return true;
    begin = end;
  }
  return false;
}

}  // namespace strata::grammar
