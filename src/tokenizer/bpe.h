// The BPE model of tokenizer.json: byte-level (GPT-2, Llama 3, Qwen, DeepSeek) or
// SentencePiece-style with byte fallback (Gemma, Llama 2). Internal to the tokenizer module.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/components.h"

namespace deepinfer::tokenization {

class BpeModel {
 public:
  explicit BpeModel(const Json& model);

  // Appends the ids of one pre-tokenized piece.
  void tokenize(std::string_view piece, std::vector<int32_t>& out) const;
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
  void merge(std::vector<int32_t>& ids) const;

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> tokens_;  // by id; empty where the vocabulary has a gap
  std::unordered_map<uint64_t, Merge> merges_;
  std::vector<int32_t> byte_ids_;  // <0xXX> tokens when byte_fallback
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  bool fuse_unk_ = false;
  int32_t unk_ = -1;
  std::string prefix_, suffix_;
};

}  // namespace deepinfer::tokenization
