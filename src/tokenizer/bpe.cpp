#include "tokenizer/bpe.h"

#include <fmt/format.h>

#include <climits>
#include <nlohmann/json.hpp>
#include <queue>

#include "core/error.h"
#include "tokenizer/text.h"

namespace deepinfer::tokenization {

int32_t token_id(const Json& value, const std::string& what) {
  // Above every real vocabulary (the largest hold about a million tokens), low enough that a
  // hostile file cannot make the id table take gigabytes.
  constexpr int64_t kMaxId = int64_t{1} << 24;
  bool in_range = value.is_number_unsigned() ? value.get<uint64_t>() <= uint64_t{kMaxId}
                  : value.is_number_integer()
                      ? value.get<int64_t>() >= 0 && value.get<int64_t>() <= kMaxId
                      : false;
  if (!in_range)
    fail("tokenizer.json: {} must be an integer in [0, {}], not {}", what, kMaxId, value.dump());
  return static_cast<int32_t>(value.get<int64_t>());
}

void BpeModel::MergeTable::build(const std::vector<std::pair<uint64_t, Merge>>& entries) {
  size_t capacity = 16;
  while (capacity < entries.size() * 2) capacity *= 2;
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  for (const auto& [key, merge] : entries) {
    size_t slot = hash(key) & mask_;
    while (slots_[slot].key != kEmpty && slots_[slot].key != key) slot = (slot + 1) & mask_;
    // A repeated merge keeps its first (best) rank, as transformers does.
    if (slots_[slot].key == kEmpty) slots_[slot] = {key, merge};
  }
}

BpeModel::BpeModel(const Json& model) {
  std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") {
    fail("tokenizer.json: model type \"{}\" is not supported (supported: BPE)", type);
  }
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      model["dropout"].get<double>() > 0)
    fail("tokenizer.json: BPE dropout is not supported for inference");
  const Json& vocab = model.at("vocab");
  if (!vocab.is_object()) fail("tokenizer.json: model.vocab must be an object");
  for (const auto& [token, id_value] : vocab.items()) {
    int32_t id = token_id(id_value, fmt::format("the id of token \"{}\"", token));
    vocab_.emplace(token, static_cast<int32_t>(id));
    if (static_cast<size_t>(id) >= tokens_.size()) tokens_.resize(static_cast<size_t>(id) + 1);
    tokens_[static_cast<size_t>(id)] = token;
  }
  auto id_of = [&](const std::string& token, const char* what) {
    auto found = vocab_.find(token);
    if (found == vocab_.end())
      fail("tokenizer.json: merge {} \"{}\" is not in the vocabulary", what, token);
    return found->second;
  };
  int32_t rank = 0;
  std::vector<std::pair<uint64_t, Merge>> merges;
  for (const Json& merge : model.at("merges")) {
    std::string left, right;
    if (merge.is_string()) {
      std::string text = merge.get<std::string>();
      size_t space = text.find(' ', 1);
      if (space == std::string::npos) fail("tokenizer.json: merge \"{}\" has no space", text);
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      fail("tokenizer.json: merge {} is neither \"a b\" nor [\"a\", \"b\"]", merge.dump());
    }
    int32_t merged = id_of(left + right, "result");
    merges.emplace_back(pair_key(id_of(left, "part"), id_of(right, "part")), Merge{rank++, merged});
  }
  merges_.build(merges);
  byte_fallback_ = model.value("byte_fallback", false);
  ignore_merges_ = model.value("ignore_merges", false);
  fuse_unk_ = model.value("fuse_unk", false);
  if (model.contains("unk_token") && model["unk_token"].is_string())
    unk_ = id_of(model["unk_token"].get<std::string>(), "unk token");
  if (model.contains("continuing_subword_prefix") && model["continuing_subword_prefix"].is_string())
    prefix_ = model["continuing_subword_prefix"].get<std::string>();
  if (model.contains("end_of_word_suffix") && model["end_of_word_suffix"].is_string())
    suffix_ = model["end_of_word_suffix"].get<std::string>();
  for (const auto& [token, id] : vocab_) {
    if (!token.empty() && static_cast<size_t>(text::utf8_length(
                              static_cast<unsigned char>(token[0]))) == token.size())
      char_ids_.emplace(text::code_point_at(token, 0), id);
  }
  if (byte_fallback_) {
    for (int byte = 0; byte < 256; ++byte) {
      auto found = vocab_.find(fmt::format("<0x{:02X}>", byte));
      byte_ids_.push_back(found == vocab_.end() ? -1 : found->second);
    }
  }
}

void BpeModel::initial_symbols(std::string_view piece, std::vector<int32_t>& ids) const {
  bool previous_unknown = false;
  for (size_t i = 0; i < piece.size();) {
    size_t length = static_cast<size_t>(text::utf8_length(static_cast<unsigned char>(piece[i])));
    int32_t id = -1;
    if (prefix_.empty() && suffix_.empty()) {
      auto found = char_ids_.find(text::code_point_at(piece, i));
      if (found != char_ids_.end()) id = found->second;
    } else {
      std::string symbol(piece.substr(i, length));
      if (i > 0) symbol.insert(0, prefix_);
      if (i + length == piece.size()) symbol += suffix_;
      auto found = vocab_.find(symbol);
      if (found != vocab_.end()) id = found->second;
    }
    if (id >= 0) {
      ids.push_back(id);
      previous_unknown = false;
    } else if (byte_fallback_ &&
               std::all_of(piece.begin() + static_cast<std::ptrdiff_t>(i),
                           piece.begin() + static_cast<std::ptrdiff_t>(i + length), [&](char ch) {
                             return byte_ids_[static_cast<unsigned char>(ch)] >= 0;
                           })) {
      for (size_t k = i; k < i + length; ++k)
        ids.push_back(byte_ids_[static_cast<unsigned char>(piece[k])]);
      previous_unknown = false;
    } else if (unk_ >= 0) {
      if (!(fuse_unk_ && previous_unknown)) ids.push_back(unk_);
      previous_unknown = true;
    }
    i += length;
  }
}

// Repeatedly merges the adjacent pair of lowest rank (leftmost among equals), as transformers
// does. Short pieces (nearly all words) keep each live pair's rank in an array and scan it;
// long ones (SentencePiece-style pieces can be whole sentences) use a heap.
void BpeModel::merge(std::vector<int32_t>& ids) const {
  if (ids.size() < 2) return;
  if (ids.size() > kScanLimit) {
    merge_with_heap(ids);
    return;
  }
  constexpr int32_t kNoMerge = INT32_MAX;
  size_t count = ids.size();
  // ranks[i]: rank of merging ids[i] with ids[i + 1] (the array stays compact: merged
  // symbols are erased, which is cheap at this size).
  int32_t ranks[kScanLimit];
  auto rank_at = [&](size_t i) {
    const Merge* found = merges_.find(pair_key(ids[i], ids[i + 1]));
    return found ? found->rank : kNoMerge;
  };
  for (size_t i = 0; i + 1 < count; ++i) ranks[i] = rank_at(i);
  while (count > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < count; ++i) {
      if (ranks[i] < ranks[best]) best = i;
    }
    if (ranks[best] == kNoMerge) break;
    ids[best] = merges_.find(pair_key(ids[best], ids[best + 1]))->merged;
    for (size_t i = best + 1; i + 1 < count; ++i) {
      ids[i] = ids[i + 1];
      ranks[i] = ranks[i + 1];
    }
    --count;
    if (best + 1 < count) ranks[best] = rank_at(best);
    if (best > 0) ranks[best - 1] = rank_at(best - 1);
  }
  ids.resize(count);
}

void BpeModel::merge_with_heap(std::vector<int32_t>& ids) const {
  struct Candidate {
    int32_t rank;
    int32_t left;  // position
    int32_t left_id, right_id;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : left > other.left;
    }
  };
  auto count = static_cast<int32_t>(ids.size());
  std::vector<int32_t> next(ids.size()), previous(ids.size());
  for (int32_t i = 0; i < count; ++i) {
    next[static_cast<size_t>(i)] = i + 1 < count ? i + 1 : -1;
    previous[static_cast<size_t>(i)] = i - 1;
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    int32_t right = next[static_cast<size_t>(left)];
    if (right < 0) return;
    int32_t a = ids[static_cast<size_t>(left)], b = ids[static_cast<size_t>(right)];
    if (const Merge* found = merges_.find(pair_key(a, b))) heap.push({found->rank, left, a, b});
  };
  for (int32_t i = 0; i + 1 < count; ++i) consider(i);
  while (!heap.empty()) {
    Candidate top = heap.top();
    heap.pop();
    auto left = static_cast<size_t>(top.left);
    int32_t right = next[left];
    if (ids[left] != top.left_id || right < 0 || ids[static_cast<size_t>(right)] != top.right_id)
      continue;  // stale: one side has merged since
    ids[left] = merges_.find(pair_key(top.left_id, top.right_id))->merged;
    int32_t after = next[static_cast<size_t>(right)];
    next[left] = after;
    if (after >= 0) previous[static_cast<size_t>(after)] = top.left;
    ids[static_cast<size_t>(right)] = -1;
    consider(previous[left]);
    consider(top.left);
  }
  std::vector<int32_t> merged;
  for (int32_t i = 0; i >= 0; i = next[static_cast<size_t>(i)])
    merged.push_back(ids[static_cast<size_t>(i)]);
  ids = std::move(merged);
}

void BpeModel::tokenize(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    auto found = vocab_.find(piece);
    if (found != vocab_.end()) {
      out.push_back(found->second);
      return;
    }
  }
  bool cacheable = piece.size() <= kCachedPieceBytes;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_);
    auto found = cache_.find(piece);
    if (found != cache_.end()) {
      out.insert(out.end(), found->second.begin(), found->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  initial_symbols(piece, ids);
  merge(ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheEntries) cache_.emplace(std::string(piece), std::move(ids));
  }
}

void BpeModel::clear_cache() const {
  std::unique_lock lock(cache_mutex_);
  cache_.clear();
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto found = vocab_.find(token);
  if (found == vocab_.end()) return std::nullopt;
  return found->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || id >= size() || tokens_[static_cast<size_t>(id)].empty()) return nullptr;
  return &tokens_[static_cast<size_t>(id)];
}

}  // namespace deepinfer::tokenization
