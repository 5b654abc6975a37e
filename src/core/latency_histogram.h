// Latencies counted at or below each bound (seconds), Prometheus-style.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <vector>

namespace deepinfer {

// Counts of observations at or below each bound; the last bucket is +Inf. sum and count as
// Prometheus histograms report them.
struct LatencyHistogram {
  static constexpr double kBounds[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1,  0.25,
                                       0.5,   1.0,   2.5,  5.0,   10.0, 30.0, 60.0};
  std::vector<int64_t> cumulative = std::vector<int64_t>(std::size(kBounds) + 1, 0);
  double sum = 0.0;
  int64_t count = 0;

  void observe(double seconds) {
    for (size_t i = 0; i < std::size(kBounds); ++i) {
      if (seconds <= kBounds[i]) ++cumulative[i];
    }
    ++cumulative.back();
    sum += seconds;
    ++count;
  }
};

}  // namespace deepinfer
