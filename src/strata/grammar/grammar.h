// A context-free grammar over bytes and an incremental matcher for it: the engine of constrained
// decoding (structured output). The grammar is built by code (grammar/json_schema.h compiles a JSON
// schema into one), never parsed from text.
//
// A rule is a set of alternatives; an alternative is a sequence of elements: a byte class (one byte
// from a set), a call of another rule, or a bounded repetition of a rule. The matcher is a pushdown
// automaton kept as a set of stacks (the grammar may be ambiguous: anyOf [integer, number] reads "12"
// two ways until a '.' decides). A stack is kept as it was left by the last byte read; the calls and
// returns that lead to the next byte are explored when that byte comes, pruned by precomputed first
// sets, so a step costs little even where many alternatives could follow.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace strata::grammar {

struct ByteSet {
  std::array<uint64_t, 4> bits{};
  void add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi) {
    for (unsigned b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
  }
  bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  bool operator==(const ByteSet&) const = default;
};

inline constexpr uint32_t kUnbounded = 0xffffffffu;

struct Element {
  enum class Kind : uint8_t { Bytes, Call, Repeat };
  Kind kind = Kind::Bytes;
  uint32_t index = 0;  // Bytes: the byte set's index; Call / Repeat: the rule's id
  uint32_t min = 0;    // Repeat: at least this many matches of the rule
  uint32_t max = 0;    // Repeat: at most this many (kUnbounded: no limit)
};

using Sequence = std::vector<Element>;

struct Rule {
  std::string name;  // for error messages and tests
  std::vector<Sequence> alts;
};

class Grammar {
 public:
  // A new rule without alternatives (add them later: a rule may call itself).
  uint32_t add_rule(std::string name);
  void add_alt(uint32_t rule, Sequence seq);
  uint32_t rule(std::string name, std::vector<Sequence> alts);  // add_rule + add_alt for each

  Element bytes(const ByteSet& set);  // one byte from the set (sets are shared between elements)
  Element byte(uint8_t b);
  static Element call(uint32_t rule) { return Element{Element::Kind::Call, rule, 0, 0}; }
  static Element repeat(uint32_t rule, uint32_t min, uint32_t max) { return Element{Element::Kind::Repeat, rule, min, max}; }
  // Appends one Bytes element per byte of `text`.
  void append_literal(Sequence& seq, std::string_view text);

  void set_root(uint32_t rule) { root_ = rule; }
  uint32_t root() const { return root_; }
  const std::vector<Rule>& rules() const { return rules_; }
  const ByteSet& set(uint32_t index) const { return sets_[index]; }

  // Checks the grammar can be matched and prepares the matcher's tables: every rule has an
  // alternative, every call names a rule, no repetition of a rule that can match nothing, no rule
  // reaching itself before reading a byte (left recursion), min <= max. Throws strata::Error naming
  // the rule. The matcher needs it done; no rules may be added after.
  void finish();
  bool finished() const { return finished_; }

  // After finish(): the bytes that can come first from element `pos` of the alternative on (a superset),
  // and whether the rest of the alternative may match nothing (may say yes where it cannot).
  const ByteSet& first_from(uint32_t rule, uint32_t alt, uint32_t pos) const { return first_[rule][alt][pos]; }
  bool nullable_from(uint32_t rule, uint32_t alt, uint32_t pos) const { return nullable_from_[rule][alt][pos]; }

 private:
  std::vector<Rule> rules_;
  std::vector<ByteSet> sets_;
  uint32_t root_ = 0;
  bool finished_ = false;
  std::vector<std::vector<std::vector<ByteSet>>> first_;
  std::vector<std::vector<std::vector<bool>>> nullable_from_;
};

// Where the matcher is: a set of expanded stacks, flattened (frames of all stacks back to back, bottom
// frame first; ends[i] is one past stack i's last frame). Plain data, so the token trie walk copies it
// into reused buffers without allocating.
struct Frame {
  uint32_t rule = 0;
  uint32_t alt = 0;
  uint32_t pos = 0;    // the element the frame is at
  uint32_t count = 0;  // matches so far of the Repeat element at pos
  bool operator==(const Frame&) const = default;
};

struct MatchState {
  std::vector<Frame> frames;
  std::vector<uint32_t> ends;
  bool dead() const { return ends.empty(); }
  std::string key() const;  // identifies the state (equal keys, equal futures)
};

class Matcher {
 public:
  // Matches against `g`, which must outlive the matcher and have passed validate().
  explicit Matcher(const Grammar& g);

  const MatchState& state() const { return state_; }
  bool dead() const { return state_.dead(); }
  // The input so far is a whole match (it may also go on).
  bool accepting() { return accepting(state_); }
  bool accepting(const MatchState& s);

  // Reads one byte: false (and the state unchanged) when no stack accepts it.
  bool advance(uint8_t b);
  // Reads bytes one by one; false (state unchanged) when any of them is refused.
  bool advance(std::string_view bytes);

  // `to` = `from` after byte b (dead when no stack accepts b). `to` keeps its buffers between calls.
  // Throws strata::Error when the stacks multiply past a bound (a pathologically ambiguous grammar).
  void step(const MatchState& from, uint8_t b, MatchState& to);

  // The same as a whole match: the bytes read since `s`, given as the state after them.
  void set_state(const MatchState& s) { state_ = s; }

 private:
  // Follows calls and returns from the stack in work_[depth] to every place that reads a byte: with
  // want >= 0, the stacks that read byte `want` go to `out` (after reading it); with want < 0, returns
  // true as soon as the stack can end (the grammar matched).
  bool explore(int depth, int want, MatchState* out);
  std::vector<Frame>& work(int depth);
  struct Branch {
    bool skip;     // move past the repetition
    uint32_t alt;  // else: enter this alternative of the called rule
  };
  std::vector<Branch>& branches_at(int depth);

  const Grammar* g_;
  MatchState state_;
  MatchState scratch_;
  std::vector<std::vector<Frame>> work_;  // one stack per branching depth, reused
  std::vector<std::vector<Branch>> branches_;
};

}  // namespace strata::grammar
