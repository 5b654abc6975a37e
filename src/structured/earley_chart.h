// An Earley recogniser over bytes for a Cfg whose terminals are byte automata: one row of
// items a byte of output, each item a production, how far into it, where it started and, when
// the next symbol is a terminal, the terminal automaton's state. Rows can be popped again, so
// a token mask tries each token's bytes and backs out of them.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "structured/grammar.h"

namespace deepinfer::structured {

class EarleyChart {
 public:
  struct Item {
    int32_t production = 0;
    int32_t dot = 0;
    int32_t origin = 0;  // the row the production started in
    int32_t state = 0;   // the terminal at the dot: its automaton's state; else 0
    bool operator==(const Item&) const = default;
  };

  // A row past this many items (a grammar ambiguous enough to keep that many parses of the
  // same output) takes no more bytes.
  static constexpr size_t kMaxRowItems = 1 << 16;

  explicit EarleyChart(const Cfg* cfg);

  size_t rows() const { return row_start_.size(); }
  // Items tried so far (kept or found already there): the work the chart has done.
  uint64_t work() const { return work_; }
  // Pushes the row after byte `c`; false (and nothing pushed) when no parse reads it.
  bool feed(uint8_t c);
  // Drops the rows past the first `rows`.
  void pop_to(size_t rows);
  // The output so far is a sentence of the grammar.
  bool complete() const;
  // What may still follow, as a key: two charts with the same key accept the same
  // continuations. The last row's items with, in place of each start row, that row's key (a
  // 128-bit hash, so rows of other outputs that parse alike share it).
  std::pair<uint64_t, uint64_t> key();
  // The last row's items that are inside or before a terminal, as (terminal, state).
  template <typename Visit>
  void each_scanning(Visit visit) const {
    for (size_t i = row_start_.back(); i < items_.size(); ++i) {
      const Item& item = items_[i];
      const Cfg::Production& p = cfg_->productions[static_cast<size_t>(item.production)];
      if (static_cast<size_t>(item.dot) < p.symbols.size() &&
          p.symbols[static_cast<size_t>(item.dot)].terminal)
        visit(p.symbols[static_cast<size_t>(item.dot)].id, item.state);
    }
  }

 private:
  const Cfg::Symbol* next_symbol(const Item& item) const;
  Item advanced(const Item& item) const;
  void begin_row();
  size_t slot_of(const Item& item, bool& found) const;
  bool add(const Item& item);
  void rehash();
  void close_row(int32_t row);
  void complete_item(const Item& item, int32_t row);
  std::pair<uint64_t, uint64_t> row_key(size_t row) const;

  const Cfg* cfg_;
  std::vector<Item> items_;
  std::vector<uint32_t> row_start_;
  std::vector<std::pair<uint64_t, uint64_t>> row_keys_;  // of the first rows, made by key()
  // The row being built: an open-addressing set of its items (indices into items_), slots of
  // an older row told apart by their stamp.
  std::vector<uint32_t> slots_, slot_stamp_;
  uint32_t stamp_ = 0;
  bool full_ = false;
  uint64_t work_ = 0;
};

}  // namespace deepinfer::structured
