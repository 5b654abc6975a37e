// The BPE model of tokenizer.json: byte-level (GPT-2, Llama 3, Qwen, DeepSeek) or
// SentencePiece-style with byte fallback (Gemma, Llama 2). Internal to the tokenizer module.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/components.h"

namespace deepinfer::tokenization {

// Lets string-keyed maps be searched with a string_view, without building a std::string.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view text) const { return std::hash<std::string_view>{}(text); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  explicit BpeModel(const Json& model);

  // Appends the ids of one pre-tokenized piece. Pieces up to kCachedPieceBytes are cached
  // (words repeat); the cache stops growing at kCacheEntries, as transformers' does.
  void tokenize(std::string_view piece, std::vector<int32_t>& out) const;
  void clear_cache() const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The token string of `id`, or nullptr outside the vocabulary.
  const std::string* id_to_token(int32_t id) const;
  int32_t size() const { return static_cast<int32_t>(tokens_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32 | static_cast<uint32_t>(right);
  }
  void initial_symbols(std::string_view piece, std::vector<int32_t>& ids) const;
  static constexpr size_t kScanLimit = 64;
  void merge(std::vector<int32_t>& ids) const;
  void merge_with_heap(std::vector<int32_t>& ids) const;

  static constexpr size_t kCachedPieceBytes = 256;
  static constexpr size_t kCacheEntries = 10000;
  mutable std::shared_mutex cache_mutex_;
  mutable StringMap<std::vector<int32_t>> cache_;

  StringMap<int32_t> vocab_;
  std::unordered_map<char32_t, int32_t> char_ids_;  // single-character tokens
  std::vector<std::string> tokens_;                 // by id; empty where the vocabulary has a gap
  // Open addressing over pair keys: merges are looked up for every adjacent pair of every
  // piece, so this is the hottest table of encoding.
  class MergeTable {
   public:
    void build(const std::vector<std::pair<uint64_t, Merge>>& entries);
    const Merge* find(uint64_t key) const {
      for (size_t slot = hash(key) & mask_;; slot = (slot + 1) & mask_) {
        const Slot& entry = slots_[slot];
        if (entry.key == key) return &entry.merge;
        if (entry.key == kEmpty) return nullptr;
      }
    }

   private:
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    static uint64_t hash(uint64_t key) {
      key ^= key >> 33;
      key *= 0xff51afd7ed558ccdull;
      return key ^ (key >> 33);
    }
    struct Slot {
      uint64_t key = kEmpty;
      Merge merge{};
    };
    std::vector<Slot> slots_{1};
    size_t mask_ = 0;
  };
  MergeTable merges_;
  std::vector<int32_t> byte_ids_;  // <0xXX> tokens when byte_fallback
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  bool fuse_unk_ = false;
  int32_t unk_ = -1;
  std::string prefix_, suffix_;
};

}  // namespace deepinfer::tokenization
