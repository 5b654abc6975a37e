#include "kernels/cpu/deepseek_v4.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "kernels/cpu/isa.h"

namespace deepinfer::cpu {
namespace {

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

// The instruction set's dot product (one summation order for a given n, whatever the batch)
// and y += a x.
float dot(const float* a, const float* b, int64_t n) {
  static const auto kernel = select_kernels().dot;
  return kernel(a, b, n);
}

void axpy(float a, const float* x, float* y, int64_t n) {
  static const auto kernel = select_kernels().axpy;
  kernel(a, x, y, n);
}

// 1 / rms of n values (an unweighted RMSNorm's factor).
float inverse_rms(const float* x, int64_t n, double eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += double{x[i]} * x[i];
  return static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(n) + eps));
}

// Projects HC x HC logits onto (nearly) doubly stochastic matrices: a row softmax plus eps,
// a column normalisation, then iterations - 1 (row, column) pairs, eps in every denominator.
void sinkhorn(float* m, int n, int iterations, float eps) {
  for (int j = 0; j < n; ++j) {
    float* row = m + j * n;
    float top = *std::max_element(row, row + n);
    float sum = 0.0f;
    for (int k = 0; k < n; ++k) sum += row[k] = std::exp(row[k] - top);
    for (int k = 0; k < n; ++k) row[k] = row[k] / sum + eps;
  }
  auto normalize = [&](bool rows) {
    for (int a = 0; a < n; ++a) {
      float sum = 0.0f;
      for (int b = 0; b < n; ++b) sum += rows ? m[a * n + b] : m[b * n + a];
      for (int b = 0; b < n; ++b) (rows ? m[a * n + b] : m[b * n + a]) /= sum + eps;
    }
  };
  normalize(false);
  for (int i = 1; i < iterations; ++i) {
    normalize(true);
    normalize(false);
  }
}

// The sequence and position of every row of a batch.
struct RowPlace {
  int seq;
  int64_t position;
};

std::vector<RowPlace> row_places(const AttentionBatch& batch) {
  std::vector<RowPlace> places;
  for (int s = 0; s < batch.num_seqs; ++s) {
    int64_t first = batch.query_start[s], end = batch.query_start[s + 1];
    for (int64_t r = first; r < end; ++r) places.push_back({s, batch.context_lens[s] - (end - r)});
  }
  return places;
}

// Element `element` of the record of (seq, position).
float* record_at(const PagedRecords& records, int seq, int64_t position, int64_t element) {
  int64_t e = records.offset + element;
  auto layer = static_cast<size_t>(e / records.row);
  DI_CHECK(layer < records.layers.size(), "paged records: element {} past the cache layers", e);
  int32_t block =
      records
          .tables[layer][int64_t{seq} * records.max_blocks_per_seq + position / records.block_size];
  DI_CHECK(block != 0, "paged records: position {} of sequence {} has no block", position, seq);
  int64_t slot = int64_t{block} * records.block_size + position % records.block_size;
  return records.layers[layer] + slot * records.row + e % records.row;
}

// Copies `count` elements between a record and memory, in runs within one cache layer.
template <bool kWrite>
void copy_record(const PagedRecords& records, int seq, int64_t position, int64_t element,
                 float* values, int64_t count) {
  for (int64_t done = 0; done < count;) {
    float* at = record_at(records, seq, position, element + done);
    int64_t run =
        std::min(count - done, records.row - (records.offset + element + done) % records.row);
    if constexpr (kWrite) {
      std::copy_n(values + done, run, at);
    } else {
      std::copy_n(at, run, values + done);
    }
    done += run;
  }
}

// Elements [first, first + width) of entry w into out.
void gather_entry(const EntryStripes& entries, int seq, int64_t w, int64_t first, int64_t width,
                  float* out) {
  for (int64_t c = first; c < first + width;) {
    int64_t token = w * entries.rate + c / entries.stripe;
    int64_t run = std::min(first + width - c, entries.stripe - c % entries.stripe);
    copy_record<false>(entries.records, seq, token, c % entries.stripe, out + (c - first), run);
    c += run;
  }
}

// The same for the sequence's entries 0..count-1, into out [count, width].
void gather_entries(const EntryStripes& entries, int seq, int64_t count, int64_t first,
                    int64_t width, float* out) {
  for (int64_t w = 0; w < count; ++w) gather_entry(entries, seq, w, first, width, out + w * width);
}

void rotate_tail(float* x, int64_t n, int rope_dims, const float* cos, const float* sin) {
  float* tail = x + n - rope_dims;
  for (int i = 0; i < rope_dims / 2; ++i) {
    float a = tail[2 * i], b = tail[2 * i + 1];
    tail[2 * i] = a * cos[i] - b * sin[i];
    tail[2 * i + 1] = b * cos[i] + a * sin[i];
  }
}

// Pools one window into entry [width]: per channel a softmax over the slots' gates.
void pool_window(const PagedRecords& inputs, const Compressor& c, int seq, int64_t w,
                 float* entry) {
  const int64_t width = c.width, projected = c.projected(), rate = c.rate;
  const float* bias = c.position_bias->as<const float>();
  std::vector<float> record(static_cast<size_t>(2 * projected));
  std::vector<float> values, gates;
  auto add_window = [&](int64_t window, int64_t half) {
    for (int64_t i = 0; i < rate; ++i) {
      copy_record<false>(inputs, seq, window * rate + i, c.input_offset, record.data(),
                         2 * projected);
      for (int64_t ch = 0; ch < width; ++ch) {
        values.push_back(record[static_cast<size_t>(half + ch)]);
        gates.push_back(record[static_cast<size_t>(projected + half + ch)] +
                        bias[i * projected + half + ch]);
      }
    }
  };
  if (c.overlapping && w > 0) add_window(w - 1, 0);
  add_window(w, c.overlapping ? width : 0);
  const int64_t slots = static_cast<int64_t>(values.size()) / width;
  for (int64_t ch = 0; ch < width; ++ch) {
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t s = 0; s < slots; ++s)
      top = std::max(top, gates[static_cast<size_t>(s * width + ch)]);
    float sum = 0.0f, pooled = 0.0f;
    for (int64_t s = 0; s < slots; ++s) {
      float e = std::exp(gates[static_cast<size_t>(s * width + ch)] - top);
      sum += e;
      pooled += e * values[static_cast<size_t>(s * width + ch)];
    }
    entry[ch] = pooled / sum;
  }
}

}  // namespace

void hc_pre(ThreadPool& pool, const Tensor& streams, const HyperConnection& hc, Tensor* mix,
            Tensor& collapsed) {
  const int n = hc.streams;
  const int64_t width = collapsed.dim(-1), tokens = collapsed.dim(0);
  const int64_t mixes = hc.fn->dim(0), flat = int64_t{n} * width;
  DI_CHECK(streams.numel() == tokens * flat && hc.fn->dim(1) == flat &&
               (mix ? mixes == int64_t{2 + n} * n : mixes == n),
           "hc_pre: streams {} and fn {} do not match {} streams of {}", streams.shape_string(),
           hc.fn->shape_string(), n, width);
  const float* fn = hc.fn->as<const float>();
  const float* base = hc.base->as<const float>();
  const float* scale = hc.scale->as<const float>();
  pool.parallel_for(tokens, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> logits(static_cast<size_t>(mixes));
    for (int64_t t = begin; t < end; ++t) {
      const float* x = streams.as<const float>() + t * flat;
      const float factor = inverse_rms(x, flat, hc.norm_eps);
      for (int64_t r = 0; r < mixes; ++r) {
        double sum = 0.0;
        for (int64_t i = 0; i < flat; ++i) sum += double{fn[r * flat + i]} * x[i];
        logits[static_cast<size_t>(r)] = static_cast<float>(sum) * factor;
      }
      std::vector<float> pre(static_cast<size_t>(n));
      for (int j = 0; j < n; ++j) pre[j] = sigmoid(logits[j] * scale[0] + base[j]) + hc.eps;
      if (mix) {
        float* m = mix->as<float>() + t * mixes;
        std::copy(pre.begin(), pre.end(), m);
        for (int j = 0; j < n; ++j)
          m[n + j] = 2.0f * sigmoid(logits[n + j] * scale[1] + base[n + j]);
        for (int i = 0; i < n * n; ++i)
          m[2 * n + i] = logits[2 * n + i] * scale[2] + base[2 * n + i];
        sinkhorn(m + 2 * n, n, hc.sinkhorn_iterations, hc.eps);
      }
      float* c = collapsed.as<float>() + t * width;
      std::fill(c, c + width, 0.0f);
      for (int j = 0; j < n; ++j) {
        for (int64_t i = 0; i < width; ++i) c[i] += pre[j] * x[j * width + i];
      }
    }
  });
}

void hc_post(ThreadPool& pool, const Tensor& out, const Tensor& mix, Tensor& streams) {
  const int64_t tokens = out.dim(0), width = out.dim(1);
  const auto n = static_cast<int>(std::lround((std::sqrt(4.0 + 4.0 * mix.dim(1)) - 2.0) / 2.0));
  DI_CHECK(int64_t{2 + n} * n == mix.dim(1) && streams.numel() == tokens * n * width,
           "hc_post: mix {} or streams {} do not match out {}", mix.shape_string(),
           streams.shape_string(), out.shape_string());
  pool.parallel_for(tokens, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> mixed(static_cast<size_t>(n * width));
    for (int64_t t = begin; t < end; ++t) {
      float* x = streams.as<float>() + t * n * width;
      const float* m = mix.as<const float>() + t * mix.dim(1);
      const float* post = m + n;
      const float* comb = m + 2 * n;
      const float* y = out.as<const float>() + t * width;
      for (int k = 0; k < n; ++k) {
        float* target = mixed.data() + k * width;
        for (int64_t i = 0; i < width; ++i) target[i] = post[k] * y[i];
        // Stream k takes column k of comb: the sum runs over the first index.
        for (int j = 0; j < n; ++j) {
          for (int64_t i = 0; i < width; ++i) target[i] += comb[j * n + k] * x[j * width + i];
        }
      }
      std::copy(mixed.begin(), mixed.end(), x);
    }
  });
}

void write_records(const Tensor& values, const AttentionBatch& batch, const PagedRecords& records) {
  const int64_t width = values.dim(-1);
  std::vector<RowPlace> places = row_places(batch);
  DI_CHECK(static_cast<int64_t>(places.size()) == values.dim(0),
           "write_records: {} rows for a batch of {}", values.dim(0), places.size());
  for (size_t t = 0; t < places.size(); ++t) {
    copy_record<true>(records, places[t].seq, places[t].position, 0,
                      values.as<float>() + static_cast<int64_t>(t) * width, width);
  }
}

void compress_windows(ThreadPool& pool, const PagedRecords& inputs, const Compressor& c,
                      const int32_t* windows, int64_t count, const float* cos, const float* sin,
                      const EntryStripes& entries) {
  const float* norm = c.norm->as<const float>();
  pool.parallel_for(count, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> entry(static_cast<size_t>(c.width));
    for (int64_t j = begin; j < end; ++j) {
      int seq = windows[2 * j];
      int64_t w = windows[2 * j + 1];
      if (seq < 0) continue;
      pool_window(inputs, c, seq, w, entry.data());
      float factor = inverse_rms(entry.data(), c.width, c.eps);
      for (int64_t i = 0; i < c.width; ++i) entry[static_cast<size_t>(i)] *= factor * norm[i];
      rotate_tail(entry.data(), c.width, c.rope_dims, cos + j * c.rope_dims / 2,
                  sin + j * c.rope_dims / 2);
      for (int64_t i = 0; i < c.width;) {
        int64_t element = c.entry_offset + i;
        int64_t run = std::min(c.width - i, entries.stripe - element % entries.stripe);
        copy_record<true>(entries.records, seq, w * entries.rate + element / entries.stripe,
                          element % entries.stripe, entry.data() + i, run);
        i += run;
      }
    }
  });
}

void index_select(ThreadPool& pool, const Tensor& queries, const Tensor& head_weights, float scale,
                  const AttentionBatch& batch, const EntryStripes& entries, int64_t key_offset,
                  int k, int32_t* selected) {
  const int64_t heads = queries.dim(1), dim = queries.dim(2);
  std::vector<RowPlace> places = row_places(batch);
  for (int s = 0; s < batch.num_seqs; ++s) {
    int64_t count = batch.context_lens[s] / entries.rate;
    std::vector<float> keys(static_cast<size_t>(count * dim));
    gather_entries(entries, s, count, key_offset, dim, keys.data());
    int64_t first = batch.query_start[s], end = batch.query_start[s + 1];
    pool.parallel_for(end - first, 1, [&](int64_t begin, int64_t stop) {
      for (int64_t t = first + begin; t < first + stop; ++t) {
        int64_t visible = (places[static_cast<size_t>(t)].position + 1) / entries.rate;
        std::vector<float> scores(static_cast<size_t>(visible));
        for (int64_t w = 0; w < visible; ++w) {
          float score = 0.0f;
          for (int64_t h = 0; h < heads; ++h) {
            const float* q = queries.as<const float>() + (t * heads + h) * dim;
            score += head_weights.as<const float>()[t * heads + h] *
                     std::max(0.0f, dot(q, keys.data() + w * dim, dim));
          }
          scores[static_cast<size_t>(w)] = score * scale;
        }
        std::vector<int32_t> order(static_cast<size_t>(visible));
        std::iota(order.begin(), order.end(), 0);
        auto kept = std::min<int64_t>(k, visible);
        std::partial_sort(
            order.begin(), order.begin() + kept, order.end(), [&](int32_t a, int32_t b) {
              float sa = scores[static_cast<size_t>(a)], sb = scores[static_cast<size_t>(b)];
              return sa > sb || (sa == sb && a < b);
            });
        int32_t* row = selected + t * k;
        std::fill(row, row + k, -1);
        std::copy_n(order.begin(), kept, row);
      }
    });
  }
}

void sparse_attention(ThreadPool& pool, const Tensor& q, const AttentionBatch& batch,
                      const PagedKvView& window_cache, int window, const EntryStripes& entries,
                      const int32_t* selected, int k, const Tensor& sinks, float scale,
                      Tensor& out) {
  const int64_t heads = q.dim(1), dim = q.dim(2);
  DI_CHECK(window_cache.key_stride() == dim && window_cache.dtype == DType::kF32,
           "sparse_attention: the window cache must hold f32 rows of {}", dim);
  std::vector<RowPlace> places = row_places(batch);
  for (int s = 0; s < batch.num_seqs; ++s) {
    int64_t count = entries.rate > 0 ? batch.context_lens[s] / entries.rate : 0;
    const int32_t* table = batch.block_tables + int64_t{s} * batch.max_blocks_per_seq;
    int64_t first = batch.query_start[s], end = batch.query_start[s + 1];
    // The entries the rows read, gathered once: the chosen ones (a decode's k of a long
    // context's many), or every one.
    std::vector<int64_t> place_of(selected ? static_cast<size_t>(count) : 0, -1);
    std::vector<int64_t> wanted;
    if (selected) {
      for (int64_t i = first * k; i < end * k; ++i) {
        const int32_t w = selected[i];
        if (w >= 0 && w < count && place_of[static_cast<size_t>(w)] < 0) {
          place_of[static_cast<size_t>(w)] = static_cast<int64_t>(wanted.size());
          wanted.push_back(w);
        }
      }
    }
    std::vector<float> gathered(static_cast<size_t>((selected ? wanted.size() : count) * dim));
    if (selected) {
      for (size_t i = 0; i < wanted.size(); ++i)
        gather_entry(entries, s, wanted[i], 0, dim, gathered.data() + i * dim);
    } else {
      gather_entries(entries, s, count, 0, dim, gathered.data());
    }
    pool.parallel_for((end - first) * heads, 1, [&](int64_t begin, int64_t stop) {
      std::vector<const float*> keys;
      std::vector<float> logits;
      for (int64_t item = begin; item < stop; ++item) {
        int64_t t = first + item / heads, h = item % heads;
        int64_t position = places[static_cast<size_t>(t)].position;
        keys.clear();
        for (int64_t j = std::max<int64_t>(batch.window_start(s), position - window + 1);
             j <= position; ++j) {
          int64_t slot = int64_t{table[j / window_cache.block_size]} * window_cache.block_size +
                         j % window_cache.block_size;
          keys.push_back(window_cache.key_floats() + slot * dim);
        }
        if (selected) {
          for (int i = 0; i < k; ++i) {
            int32_t w = selected[t * k + i];
            if (w >= 0 && w < count)
              keys.push_back(gathered.data() + place_of[static_cast<size_t>(w)] * dim);
          }
        } else if (entries.rate > 0) {
          for (int64_t w = 0; w < (position + 1) / entries.rate; ++w)
            keys.push_back(gathered.data() + w * dim);
        }
        const float* query = q.as<const float>() + (t * heads + h) * dim;
        const float sink = sinks.as<const float>()[h];
        logits.resize(keys.size());
        float top = sink;
        for (size_t j = 0; j < keys.size(); ++j) {
          logits[j] = scale * dot(query, keys[j], dim);
          top = std::max(top, logits[j]);
        }
        float sum = std::exp(sink - top);
        float* o = out.as<float>() + (t * heads + h) * dim;
        std::fill(o, o + dim, 0.0f);
        for (size_t j = 0; j < keys.size(); ++j) {
          float e = std::exp(logits[j] - top);
          sum += e;
          axpy(e, keys[j], o, dim);
        }
        for (int64_t i = 0; i < dim; ++i) o[i] /= sum;
      }
    });
  }
}

}  // namespace deepinfer::cpu
