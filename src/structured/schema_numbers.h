// The number part of the schema matcher (schema_numbers.cpp): where a number being written
// is, and what may come next under a node's type and bounds.
#pragma once

#include <cstdint>

#include "structured/json_schema.h"

namespace deepinfer::structured {

enum class NumberPart : uint8_t {
  kMinus,
  kZero,
  kInt,
  kFracStart,
  kFrac,
  kExpStart,
  kExpSign,
  kExp
};

struct NumberReading {
  NumberPart part = NumberPart::kMinus;
  bool negative = false;
  int int_digits = 0, frac_digits = 0;
  long double int_value = 0, frac_value = 0;  // frac_value: the fraction's digits as a fraction
  bool operator==(const NumberReading&) const = default;
};

// Bounded numbers are read exactly as long doubles up to this many integer digits.
constexpr int kMaxBoundedDigits = 18;

// The node limits its numbers' values (minimum, maximum or multipleOf): only then do the
// digits read so far matter, beyond where in the grammar the number is.
bool bounded(const SchemaNode& n);
// `c` continues the number (its grammar; bounds aside).
bool number_continues(const SchemaNode& n, const NumberReading& reading, uint8_t c);
// Takes a byte that continues the number; false when no completion would stay in bounds.
bool number_take(const SchemaNode& n, NumberReading& reading, uint8_t c);
// Some completion of what was written lies inside the bounds.
bool number_feasible(const SchemaNode& n, const NumberReading& reading);
// The number may end here: complete and inside the bounds.
bool number_can_end(const SchemaNode& n, const NumberReading& reading);

}  // namespace deepinfer::structured
