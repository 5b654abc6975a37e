// Numbers as the schema matcher reads them, byte by byte: the JSON number grammar (integers
// only where the node takes no other numbers), with bounds checked as the digits come (each
// digit must leave some completion inside them). Bounded numbers are written without an
// exponent.
#include "structured/schema_numbers.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace deepinfer::structured {
namespace {

bool is_digit(uint8_t c) {
  return c >= '0' && c <= '9';
}

bool integer_only(const SchemaNode& n) {
  return !(n.types & kNumberType);
}
bool exponent(const SchemaNode& n, uint8_t c) {
  return (c == 'e' || c == 'E') && !integer_only(n) && !bounded(n);
}

// Some number in [low, high] (magnitudes as written; `negative`: the sign written) that the
// node allows.
bool reachable(const SchemaNode& n, bool negative, long double low, long double high) {
  const bool integer = integer_only(n);
  long double lo = negative ? -high : low;
  long double hi = negative ? -low : high;
  if (integer) {
    lo = ceill(lo);
    hi = floorl(hi);
  }
  if (n.minimum) {
    long double m = n.minimum->value;
    if (integer) m = n.minimum->exclusive ? floorl(m) + 1 : ceill(m);
    if (!integer && n.minimum->exclusive && hi <= m) return false;
    lo = std::max(lo, m);
  }
  if (n.maximum) {
    long double m = n.maximum->value;
    if (integer) m = n.maximum->exclusive ? ceill(m) - 1 : floorl(m);
    if (!integer && n.maximum->exclusive && lo >= m) return false;
    hi = std::min(hi, m);
  }
  if (lo > hi) return false;
  if (integer && n.multiple_of > 0) {
    const auto step = static_cast<long double>(n.multiple_of);
    return ceill(lo / step) * step <= hi;
  }
  return true;
}

}  // namespace

bool bounded(const SchemaNode& n) {
  return n.minimum || n.maximum || n.multiple_of > 0;
}

bool number_continues(const SchemaNode& n, const NumberReading& reading, uint8_t c) {
  const bool fraction = c == '.' && !integer_only(n);
  switch (reading.part) {
    case NumberPart::kMinus:
    case NumberPart::kFracStart:
    case NumberPart::kExpSign:
      return is_digit(c);
    case NumberPart::kZero:
      return fraction || exponent(n, c);
    case NumberPart::kInt:
      return is_digit(c) || fraction || exponent(n, c);
    case NumberPart::kFrac:
      return is_digit(c) || exponent(n, c);
    case NumberPart::kExpStart:
      return c == '+' || c == '-' || is_digit(c);
    case NumberPart::kExp:
      return is_digit(c);
  }
  return false;
}

bool number_take(const SchemaNode& n, NumberReading& r, uint8_t c) {
  const int digit = c - '0';
  switch (r.part) {
    case NumberPart::kMinus:
      r.part = c == '0' ? NumberPart::kZero : NumberPart::kInt;
      r.int_digits = 1;
      r.int_value = digit;
      break;
    case NumberPart::kZero:
    case NumberPart::kInt:
      if (c == '.') {
        r.part = NumberPart::kFracStart;
      } else if (c == 'e' || c == 'E') {
        r.part = NumberPart::kExpStart;
      } else {
        r.int_value = r.int_value * 10 + digit;
        if (++r.int_digits > kMaxBoundedDigits && bounded(n)) return false;
      }
      break;
    case NumberPart::kFracStart:
    case NumberPart::kFrac:
      if (c == 'e' || c == 'E') {
        r.part = NumberPart::kExpStart;
      } else {
        r.part = NumberPart::kFrac;
        r.frac_value += digit * powl(10.0L, -static_cast<long double>(++r.frac_digits));
      }
      break;
    case NumberPart::kExpStart:
      r.part = is_digit(c) ? NumberPart::kExp : NumberPart::kExpSign;
      break;
    default:
      r.part = NumberPart::kExp;
      break;
  }
  return number_feasible(n, r);
}

bool number_feasible(const SchemaNode& n, const NumberReading& r) {
  if (!bounded(n)) return true;
  const bool integer = integer_only(n);
  switch (r.part) {
    case NumberPart::kMinus:
      return reachable(n, r.negative, 0, std::numeric_limits<long double>::infinity());
    case NumberPart::kZero:
      return reachable(n, r.negative, 0, integer ? 0 : 1);
    case NumberPart::kInt: {
      // It ends here, or takes k more digits: [v 10^k, (v + 1) 10^k).
      long double low = r.int_value, span = 1;
      for (int k = 0; k <= kMaxBoundedDigits - r.int_digits; ++k, low *= 10, span *= 10)
        if (reachable(n, r.negative, low, integer ? low + span - 1 : low + span)) return true;
      return false;
    }
    case NumberPart::kFracStart:
    case NumberPart::kFrac: {
      const long double x = r.int_value + r.frac_value;
      return reachable(n, r.negative, x, x + powl(10.0L, -static_cast<long double>(r.frac_digits)));
    }
    default:
      return true;
  }
}

bool number_can_end(const SchemaNode& n, const NumberReading& r) {
  if (r.part != NumberPart::kZero && r.part != NumberPart::kInt && r.part != NumberPart::kFrac &&
      r.part != NumberPart::kExp)
    return false;
  if (!bounded(n)) return true;
  // The value as validators hold it (a double, as the bounds are): 1.1 then meets a minimum of
  // 1.1, which its closer long double reading falls just short of.
  const long double value = static_cast<double>(r.int_value + r.frac_value);
  return reachable(n, r.negative, value, value);
}

}  // namespace deepinfer::structured
