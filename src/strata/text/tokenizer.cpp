#include "strata/text/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <queue>

#include "strata/base/error.h"
#include "strata/text/byte_unicode.h"
#include "strata/text/unicode_nfc.h"

namespace strata {
namespace {

constexpr size_t kCacheMaxEntries = 1 << 18;
constexpr size_t kCacheMaxWordBytes = 256;

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

Tokenizer::Tokenizer(Vocab vocab) : vocab_(std::move(vocab)) {
  validate_vocab(vocab_, "tokenizer");
  pre_ = std::make_unique<PreTokenizer>(vocab_.pre);

  const size_t n = vocab_.tokens.size();
  raw_.resize(n);
  std::unordered_map<std::string_view, int32_t> stored_to_id;  // byte-level form -> id, normal tokens
  stored_to_id.reserve(n * 2);
  raw_to_id_.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    const std::string& tok = vocab_.tokens[i];
    switch (vocab_.token_types[i]) {
      case kTokenControl:
      case kTokenUserDefined:
        if (tok.empty()) fail("tokenizer: added token ", id, " is empty");
        raw_[i] = tok;
        added_.push_back({tok, id, vocab_.token_types[i] == kTokenControl});
        break;
      case kTokenUnused:
        break;  // padding rows: never produced, decode to nothing
      default: {
        // Normal tokens are stored byte-level; a token with a code point that stands for no byte
        // decodes to its own UTF-8 bytes (what the HF ByteLevel decoder does too).
        auto bytes = byte_level_to_bytes(tok);
        raw_[i] = bytes ? std::move(*bytes) : tok;
        stored_to_id.emplace(tok, id);
        break;
      }
    }
    raw_to_id_.emplace(raw_[i], id);  // first id wins for duplicates
  }
  raw_to_id_.erase(std::string());

  for (int b = 0; b < 256; ++b) {
    auto it = stored_to_id.find(bytes_to_byte_level(std::string(1, static_cast<char>(b))));
    if (it == stored_to_id.end()) fail("tokenizer: the vocabulary has no token for byte 0x", std::hex, b);
    byte_ids_[static_cast<size_t>(b)] = it->second;
  }

  merges_.reserve(vocab_.merges.size() * 2);
  for (size_t r = 0; r < vocab_.merges.size(); ++r) {
    const std::string& m = vocab_.merges[r];
    const size_t sp = m.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 >= m.size() || m.find(' ', sp + 1) != std::string::npos) {
      fail("tokenizer: merge ", r, " '", m, "' is not of the form 'left right'");
    }
    const std::string_view left(m.data(), sp), right(m.data() + sp + 1, m.size() - sp - 1);
    auto l = stored_to_id.find(left), rt = stored_to_id.find(right);
    if (l == stored_to_id.end() || rt == stored_to_id.end()) {
      fail("tokenizer: merge ", r, " '", m, "' names a part that is not a token");
    }
    auto merged = stored_to_id.find(std::string(left) + std::string(right));
    if (merged == stored_to_id.end()) fail("tokenizer: merge ", r, " '", m, "' produces a string that is not a token");
    merges_.emplace(pair_key(l->second, rt->second), MergeTarget{static_cast<int32_t>(r), merged->second});
  }

  std::stable_sort(added_.begin(), added_.end(),
                   [](const AddedToken& a, const AddedToken& b) { return a.text.size() > b.text.size(); });
  for (const auto& a : added_) added_first_byte_[static_cast<uint8_t>(a.text[0])] = true;

  if (vocab_.eos_id >= 0) end_ids_.push_back(vocab_.eos_id);
  for (const char* marker : {"<|im_end|>", "<|endoftext|>"}) {
    auto it = raw_to_id_.find(marker);
    if (it != raw_to_id_.end() && vocab_.token_types[static_cast<size_t>(it->second)] == kTokenControl) {
      end_ids_.push_back(it->second);
    }
  }
}

Tokenizer::~Tokenizer() = default;

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= n_vocab()) fail("token id ", id, " is outside the vocabulary (0..", n_vocab() - 1, ")");
}

const std::string& Tokenizer::token_text(int32_t id) const {
  check_id(id);
  return raw_[static_cast<size_t>(id)];
}

bool Tokenizer::is_special(int32_t id) const {
  check_id(id);
  return vocab_.token_types[static_cast<size_t>(id)] == kTokenControl;
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
  return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
}

std::optional<int32_t> Tokenizer::find_token(std::string_view piece) const {
  auto it = raw_to_id_.find(std::string(piece));
  if (it == raw_to_id_.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    check_id(id);
    if (skip_special && vocab_.token_types[static_cast<size_t>(id)] == kTokenControl) continue;
    out += raw_[static_cast<size_t>(id)];
  }
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  size_t plain_start = 0;
  for (size_t i = 0; i < text.size();) {
    const AddedToken* hit = nullptr;
    if (added_first_byte_[static_cast<uint8_t>(text[i])]) {
      for (const auto& a : added_) {  // longest first: the first hit is the longest at i
        if (a.special && !parse_special) continue;
        if (a.text.size() <= text.size() - i && std::memcmp(text.data() + i, a.text.data(), a.text.size()) == 0) {
          hit = &a;
          break;
        }
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    encode_plain(text.substr(plain_start, i - plain_start), out);
    out.push_back(hit->id);
    i += hit->text.size();
    plain_start = i;
  }
  encode_plain(text.substr(plain_start), out);
  return out;
}

void Tokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string normalized;
  if (!nfc_quick_check(text)) {
    normalized = nfc_normalize(text);
    text = normalized;
  }
  std::vector<std::string_view> words;
  words.reserve(text.size() / 4 + 1);
  pre_->split(text, words);
  for (std::string_view w : words) encode_word(w, out);
}

void Tokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() == 1) {
    out.push_back(byte_ids_[static_cast<uint8_t>(word[0])]);
    return;
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(std::string(word));
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  bpe(word, out);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kCacheMaxEntries) cache_.clear();
    cache_.emplace(std::string(word), std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()));
  }
}

const Tokenizer::MergeTarget* Tokenizer::find_merge(int32_t left, int32_t right) const {
  auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

// BPE as HF `tokenizers` runs it: a queue of candidate merges ordered by (rank, position of the
// left symbol); popping the best one, skipping candidates whose symbols changed since they were
// queued, and queueing the new pairs the merge creates with its neighbours.
void Tokenizer::bpe(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1 at the ends
    bool alive;
  };
  struct Candidate {
    int32_t rank, pos, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const auto n = static_cast<int32_t>(word.size());
  std::vector<Symbol> sym(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    sym[static_cast<size_t>(i)] = {byte_ids_[static_cast<uint8_t>(word[static_cast<size_t>(i)])], i - 1,
                                   i + 1 < n ? i + 1 : -1, true};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const MergeTarget* m = find_merge(sym[static_cast<size_t>(i)].id, sym[static_cast<size_t>(i + 1)].id)) {
      queue.push({m->rank, i, m->merged});
    }
  }
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = sym[static_cast<size_t>(c.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = sym[static_cast<size_t>(left.next)];
    const MergeTarget* m = find_merge(left.id, right.id);
    if (!m || m->merged != c.merged) continue;  // stale: one side was merged into something else
    left.id = c.merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[static_cast<size_t>(right.next)].prev = c.pos;
    if (left.prev >= 0) {
      if (const MergeTarget* pm = find_merge(sym[static_cast<size_t>(left.prev)].id, left.id)) {
        queue.push({pm->rank, left.prev, pm->merged});
      }
    }
    if (left.next >= 0) {
      if (const MergeTarget* nm = find_merge(left.id, sym[static_cast<size_t>(left.next)].id)) {
        queue.push({nm->rank, c.pos, nm->merged});
      }
    }
  }
  for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    out.push_back(sym[static_cast<size_t>(i)].id);
    if (n == 0) break;
  }
}

}  // namespace strata
