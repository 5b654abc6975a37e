// The Earley recogniser: scan (terminal automata step on the byte), then predict and complete
// to closure, with nullable rules advanced over as they are predicted (Aycock and Horspool's
// remedy, so that a rule completed with no text still moves the items that wait for it).
#include "structured/earley_chart.h"

#include <xxhash.h>

#include <algorithm>
#include <array>

namespace deepinfer::structured {

EarleyChart::EarleyChart(const Cfg* cfg) : cfg_(cfg) {
  row_start_.push_back(0);
  begin_row();
  Item start;
  start.production = cfg->start_production;
  start.state = next_symbol(start) && next_symbol(start)->terminal ? ByteDfa::kStart : 0;
  add(start);
  close_row(0);
}

const Cfg::Symbol* EarleyChart::next_symbol(const Item& item) const {
  const Cfg::Production& p = cfg_->productions[static_cast<size_t>(item.production)];
  return static_cast<size_t>(item.dot) < p.symbols.size()
             ? &p.symbols[static_cast<size_t>(item.dot)]
             : nullptr;
}

EarleyChart::Item EarleyChart::advanced(const Item& item) const {
  Item next = item;
  ++next.dot;
  const Cfg::Symbol* symbol = next_symbol(next);
  next.state = symbol && symbol->terminal ? ByteDfa::kStart : 0;
  return next;
}

void EarleyChart::begin_row() {
  if (slots_.empty()) {
    slots_.assign(64, 0);
    slot_stamp_.assign(64, 0);
  }
  if (++stamp_ == 0) {  // the stamps wrapped: forget every slot
    std::fill(slot_stamp_.begin(), slot_stamp_.end(), 0);
    stamp_ = 1;
  }
  full_ = false;
}

size_t EarleyChart::slot_of(const Item& item, bool& found) const {
  uint64_t hash = static_cast<uint32_t>(item.production) * 0x9E3779B97F4A7C15ull;
  hash ^= (static_cast<uint64_t>(static_cast<uint32_t>(item.dot)) << 32 |
           static_cast<uint32_t>(item.origin)) *
          0xC2B2AE3D27D4EB4Full;
  hash ^= static_cast<uint32_t>(item.state) * 0x165667B19E3779F9ull;
  hash ^= hash >> 29;
  const size_t mask = slots_.size() - 1;
  for (size_t slot = hash & mask;; slot = (slot + 1) & mask) {
    if (slot_stamp_[slot] != stamp_) {
      found = false;
      return slot;
    }
    if (items_[slots_[slot]] == item) {
      found = true;
      return slot;
    }
  }
}

bool EarleyChart::add(const Item& item) {
  ++work_;
  const size_t in_row = items_.size() - row_start_.back();
  if (in_row >= kMaxRowItems) {
    full_ = true;
    return false;
  }
  bool found = false;
  const size_t slot = slot_of(item, found);
  if (found) return false;
  slot_stamp_[slot] = stamp_;
  slots_[slot] = static_cast<uint32_t>(items_.size());
  items_.push_back(item);
  if ((in_row + 1) * 2 > slots_.size()) rehash();
  return true;
}

void EarleyChart::rehash() {
  slots_.assign(slots_.size() * 2, 0);
  slot_stamp_.assign(slots_.size(), 0);
  stamp_ = 1;
  for (size_t i = row_start_.back(); i < items_.size(); ++i) {
    bool found = false;
    const size_t slot = slot_of(items_[i], found);
    slot_stamp_[slot] = stamp_;
    slots_[slot] = static_cast<uint32_t>(i);
  }
}

bool EarleyChart::feed(uint8_t c) {
  const size_t begin = row_start_.back(), end = items_.size();
  row_start_.push_back(static_cast<uint32_t>(end));
  begin_row();
  for (size_t i = begin; i < end; ++i) {
    const Item item = items_[i];
    const Cfg::Symbol* symbol = next_symbol(item);
    if (!symbol || !symbol->terminal) continue;
    const ByteDfa& dfa = *cfg_->terminals[static_cast<size_t>(symbol->id)];
    const int state = dfa.next(item.state, c);
    if (state == ByteDfa::kDead) continue;
    if (!dfa.final(state)) {
      Item inside = item;
      inside.state = state;
      add(inside);
    }
    if (dfa.accepting(state)) add(advanced(item));
  }
  if (items_.size() == end || full_) {
    pop_to(row_start_.size() - 1);
    return false;
  }
  close_row(static_cast<int32_t>(row_start_.size()) - 1);
  if (full_) {
    pop_to(row_start_.size() - 1);
    return false;
  }
  return true;
}

void EarleyChart::close_row(int32_t row) {
  for (size_t i = row_start_[static_cast<size_t>(row)]; i < items_.size(); ++i) {
    const Item item = items_[i];
    const Cfg::Symbol* symbol = next_symbol(item);
    if (!symbol) {
      complete_item(item, row);
    } else if (symbol->terminal) {
      if (item.state == ByteDfa::kStart && cfg_->terminal_nullable[static_cast<size_t>(symbol->id)])
        add(advanced(item));
    } else {
      for (int32_t production : cfg_->rule_productions[static_cast<size_t>(symbol->id)]) {
        Item predicted;
        predicted.production = production;
        predicted.origin = row;
        const Cfg::Symbol* first = next_symbol(predicted);
        predicted.state = first && first->terminal ? ByteDfa::kStart : 0;
        add(predicted);
      }
      if (cfg_->rule_nullable[static_cast<size_t>(symbol->id)]) add(advanced(item));
    }
  }
}

// Every item of the completed production's origin row that waits for its rule moves on.
void EarleyChart::complete_item(const Item& item, int32_t row) {
  const int32_t rule = cfg_->productions[static_cast<size_t>(item.production)].rule;
  const size_t origin = static_cast<size_t>(item.origin);
  const size_t begin = row_start_[origin];
  for (size_t i = begin; i < (item.origin == row ? items_.size() : row_start_[origin + 1]); ++i) {
    const Item waiting = items_[i];
    const Cfg::Symbol* symbol = next_symbol(waiting);
    if (symbol && !symbol->terminal && symbol->id == rule) add(advanced(waiting));
  }
}

void EarleyChart::pop_to(size_t rows) {
  if (rows >= row_start_.size()) return;
  if (row_keys_.size() > rows) row_keys_.resize(rows);
  items_.resize(row_start_[rows]);
  row_start_.resize(rows);
}

bool EarleyChart::complete() const {
  for (size_t i = row_start_.back(); i < items_.size(); ++i) {
    const Item& item = items_[i];
    if (item.production == cfg_->start_production && item.origin == 0 && !next_symbol(item))
      return true;
  }
  return false;
}

// A row's items, each with its start row's key in place of the row's index (or a mark for
// this row itself), sorted: the hash does not see the order items were found in.
std::pair<uint64_t, uint64_t> EarleyChart::row_key(size_t row) const {
  const size_t begin = row_start_[row];
  const size_t end = row + 1 < row_start_.size() ? row_start_[row + 1] : items_.size();
  std::vector<std::array<uint64_t, 4>> entries;
  entries.reserve(end - begin);
  for (size_t i = begin; i < end; ++i) {
    const Item& item = items_[i];
    const auto origin = static_cast<size_t>(item.origin);
    const std::pair<uint64_t, uint64_t> from =
        origin == row ? std::pair{~uint64_t{0}, ~uint64_t{0}} : row_keys_[origin];
    entries.push_back({static_cast<uint64_t>(static_cast<uint32_t>(item.production)) << 32 |
                           static_cast<uint32_t>(item.dot),
                       static_cast<uint32_t>(item.state), from.first, from.second});
  }
  std::sort(entries.begin(), entries.end());
  const XXH128_hash_t hash = XXH3_128bits(entries.data(), entries.size() * sizeof(entries[0]));
  return {hash.low64, hash.high64};
}

std::pair<uint64_t, uint64_t> EarleyChart::key() {
  while (row_keys_.size() < row_start_.size()) row_keys_.push_back(row_key(row_keys_.size()));
  return row_keys_.back();
}

}  // namespace deepinfer::structured
