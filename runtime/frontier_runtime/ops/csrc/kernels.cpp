// Frontier's native CPU kernels, registered as torch.ops.frontier.*: paged attention, the fused
// elementwise steps of a decoder layer (RMSNorm, SwiGLU, rotary + KV cache write), the panel GEMM
// (float32, int8 or bfloat16 weights) and the binding of torch's intra-op threads to CPUs.
//
// Built ahead of time, never at serving time: `python -m frontier_runtime.ops.build_kernels`
// compiles this one file four times (avx512bf16, avx512, avx2, portable; see build_kernels.py)
// and cpu_kernel.py loads the best variant the CPU runs. Every x86 intrinsic sits behind
// `#if defined(__AVX512F__)` with a portable path beside it, so the portable build (no -march)
// compiles on any architecture torch supports; the rest is plain C++ the compiler vectorises.
//
// Paged attention: one call per layer attends every query token of the step (decodes and prefill
// chunks alike) to its own sequence's keys, read in place from the paged cache through the block
// table: no gather copy, no Python loop over sequences. Work is split over (sequence, tile of 16
// query tokens, KV head) with at::parallel_for, so it uses torch's intra-op threads. Each work
// item keeps the `group` query heads of its KV head together, so a key block is read once for all
// of them (GQA costs no extra memory traffic), and runs an online softmax in float32 over the
// blocks. A sliding window (Mistral's) bounds each query's keys from below as well: blocks wholly
// before every query's window of a work item are not read at all.

#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <ATen/Dispatch.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <c10/util/Float8_e4m3fn.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <algorithm>
#include <atomic>
#include <pthread.h>
#include <sched.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t QTILE = 16;     // query tokens of one sequence per work item
constexpr float NEG = -1.0e30f;   // "minus infinity" that stays finite through exp()

// exp(x) for x <= 0 (Cephes expf: range reduction by ln 2, degree-6 polynomial; ~1 ulp), written so
// the compiler vectorises it inside the simd loops below (libm's expf would not be).
inline float exp_neg(float x) {
  x = std::max(x, -87.0f);  // (also right for 0 < x <= 88: silu uses that)
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float f = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * f + 1.3981999507e-3f;
  p = p * f + 8.3334519073e-3f;
  p = p * f + 4.1665795894e-2f;
  p = p * f + 1.6666665459e-1f;
  p = p * f + 5.0000001201e-1f;
  p = p * f * f + f + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

template <typename C>
inline void to_float(const C* src, float* dst, int64_t n, float scale) {
#pragma omp simd
  for (int64_t d = 0; d < n; ++d) dst[d] = static_cast<float>(src[d]) * scale;
}

#if defined(__AVX512F__)
// bf16 -> float32 is a 16-bit shift; GCC does not vectorise c10::BFloat16's conversion (it goes
// through memcpy), and a bf16 KV cache converts every block it attends to.
inline void to_float(const c10::BFloat16* src, float* dst, int64_t n, float scale) {
  const __m512 s = _mm512_set1_ps(scale);
  int64_t d = 0;
  for (; d + 16 <= n; d += 16) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + d)));
    _mm512_storeu_ps(dst + d, _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)), s));
  }
  for (; d < n; ++d) dst[d] = static_cast<float>(src[d]) * scale;
}
#endif

// One query row against one block of keys: scores, online-softmax update, V accumulation over the
// block's keys first .. valid - 1 (first > 0 only where a sliding window starts inside the block).
// BSC is the block size when known at compile time (16, the default: scores stay in registers).
template <int BSC>
inline void row_block(const float* qr, const float* kt, const float* vt, int64_t D, int64_t bs_dyn,
                      int64_t first, int64_t valid, float& m, float& l, float* ar, float* sc_buf,
                      float* p_buf) {
  const int64_t BS = BSC ? BSC : bs_dyn;
  float sc_local[BSC ? BSC : 1];
  float p_local[BSC ? BSC : 1];
  float* sc = BSC ? sc_local : sc_buf;
  float* p = BSC ? p_local : p_buf;
  // Four partial sums over head_dim: a single one would chain D dependent FMAs per block.
  float part[4][BSC ? BSC : 1];
  if (BSC) {
    for (int j = 0; j < 4; ++j)
      for (int64_t t = 0; t < BS; ++t) part[j][t] = 0.0f;
    int64_t d = 0;
    for (; d + 4 <= D; d += 4) {
      for (int j = 0; j < 4; ++j) {
        const float qd = qr[d + j];
        const float* kd = kt + (d + j) * BS;
#pragma omp simd
        for (int64_t t = 0; t < BS; ++t) part[j][t] += qd * kd[t];
      }
    }
    for (; d < D; ++d) {
      const float qd = qr[d];
      const float* kd = kt + d * BS;
#pragma omp simd
      for (int64_t t = 0; t < BS; ++t) part[0][t] += qd * kd[t];
    }
#pragma omp simd
    for (int64_t t = 0; t < BS; ++t) sc[t] = (part[0][t] + part[1][t]) + (part[2][t] + part[3][t]);
  } else {
    for (int64_t t = 0; t < BS; ++t) sc[t] = 0.0f;
    for (int64_t d = 0; d < D; ++d) {
      const float qd = qr[d];
      const float* kd = kt + d * BS;
#pragma omp simd
      for (int64_t t = 0; t < BS; ++t) sc[t] += qd * kd[t];
    }
  }
  float block_max = NEG;
  for (int64_t t = first; t < valid; ++t) block_max = std::max(block_max, sc[t]);
  const float m_new = std::max(m, block_max);
  if (m_new > m && l > 0.0f) {
    const float corr = exp_neg(m - m_new);
    l *= corr;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) ar[d] *= corr;
  }
  m = m_new;
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t t = 0; t < BS; ++t) {
    const float e = t >= first && t < valid ? exp_neg(sc[t] - m_new) : 0.0f;
    p[t] = e;
    sum += e;
  }
  for (int64_t t = first; t < valid; ++t) {
    const float pt = p[t];
    const float* v = vt + t * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) ar[d] += pt * v[d];
  }
  l += sum;
}

// K cache [blocks, kv_heads, head_dim, block_size] (keys of a block side by side, so one query's
// scores against a block are head_dim vector FMAs); V cache [blocks, kv_heads, block_size, head_dim].
// window > 0: the query at position p sees keys p - window + 1 .. p only; 0: keys 0 .. p.
template <typename Q, typename C>
void attend(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
            const at::Tensor& tables, const at::Tensor& rows, const at::Tensor& query_start,
            const at::Tensor& seq_lens, double scale, double k_scale, double v_scale, int64_t window) {
  const int64_t S = rows.size(0);
  const int64_t Hq = q.size(1), D = q.size(2);
  const int64_t KVH = k_cache.size(1), BS = k_cache.size(3);
  const int64_t G = Hq / KVH;
  const int64_t max_blocks = tables.size(1);
  const int32_t* tab = tables.data_ptr<int32_t>();
  const int32_t* row = rows.data_ptr<int32_t>();
  const int32_t* qs = query_start.data_ptr<int32_t>();
  const int32_t* sl = seq_lens.data_ptr<int32_t>();
  const Q* qp = q.data_ptr<Q>();
  const int64_t q_row = q.stride(0);  // q may be a view into the fused qkv projection
  Q* op = out.data_ptr<Q>();
  const C* kp = k_cache.data_ptr<C>();
  const C* vp = v_cache.data_ptr<C>();
  const float ks = static_cast<float>(k_scale), vs = static_cast<float>(v_scale);
  // A float32 cache at scale 1 is read where it lies; any other is converted a block at a time.
  const bool direct = std::is_same<C, float>::value && ks == 1.0f && vs == 1.0f;

  std::vector<int64_t> item_seq, item_first;
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t t = qs[s]; t < qs[s + 1]; t += QTILE) {
      item_seq.push_back(s);
      item_first.push_back(t);
    }
  }
  const int64_t work = static_cast<int64_t>(item_seq.size()) * KVH;
  at::parallel_for(0, work, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(QTILE * G * D), acc(QTILE * G * D), kf(BS * D), vf(BS * D);
    std::vector<float> m(QTILE * G), l(QTILE * G), score(BS), prob(BS);
    for (int64_t w = begin; w < end; ++w) {
      const int64_t it = w / KVH, h = w % KVH;
      const int64_t s = item_seq[it], q0 = item_first[it];
      const int64_t q1 = std::min<int64_t>(qs[s + 1], q0 + QTILE);
      const int64_t nq = q1 - q0, R = nq * G;
      // Position of query q0: the sequence's new tokens are its last (qs[s+1] - qs[s]) ones.
      const int64_t first_pos = sl[s] - (qs[s + 1] - qs[s]) + (q0 - qs[s]);
      const int64_t num_keys = first_pos + nq;  // the last query sees keys 0 .. its position
      // The first query's window starts earliest: blocks before it are no query's.
      const int64_t first_key = window > 0 ? std::max<int64_t>(0, first_pos - window + 1) : 0;
      for (int64_t i = 0; i < nq; ++i)
        for (int64_t g = 0; g < G; ++g)
          to_float(qp + (q0 + i) * q_row + (h * G + g) * D, &qf[(i * G + g) * D], D, static_cast<float>(scale));
      std::fill(m.begin(), m.begin() + R, NEG);
      std::fill(l.begin(), l.begin() + R, 0.0f);
      std::fill(acc.begin(), acc.begin() + R * D, 0.0f);
      const int32_t* trow = tab + static_cast<int64_t>(row[s]) * max_blocks;
      for (int64_t b = first_key / BS; b * BS < num_keys; ++b) {
        const int64_t tile = (static_cast<int64_t>(trow[b]) * KVH + h) * D * BS;
        const int64_t kn = std::min<int64_t>(BS, num_keys - b * BS);
        const float* kt;
        const float* vt;
        // The next block of the table is anywhere in the pool, beyond the hardware prefetcher's
        // reach (it follows a page): ask for its K and V tiles while this block is computed.
        if ((b + 1) * BS < num_keys) {
          const int64_t next = (static_cast<int64_t>(trow[b + 1]) * KVH + h) * D * BS;
          const char* nk = reinterpret_cast<const char*>(kp + next);
          const char* nv = reinterpret_cast<const char*>(vp + next);
          for (int64_t byte = 0; byte < D * BS * static_cast<int64_t>(sizeof(C)); byte += 64) {
            __builtin_prefetch(nk + byte);
            __builtin_prefetch(nv + byte);
          }
        }
        if (direct) {
          kt = reinterpret_cast<const float*>(kp) + tile;
          vt = reinterpret_cast<const float*>(vp) + tile;
        } else {
          to_float(kp + tile, kf.data(), D * BS, ks);
          to_float(vp + tile, vf.data(), kn * D, vs);
          kt = kf.data();
          vt = vf.data();
        }
        for (int64_t r = 0; r < R; ++r) {
          const int64_t pos = first_pos + r / G;
          const int64_t valid = std::min<int64_t>(kn, pos - b * BS + 1);
          const int64_t first = window > 0 ? std::max<int64_t>(0, pos - window + 1 - b * BS) : 0;
          if (valid <= first) continue;
          if (BS == 16) {
            row_block<16>(&qf[r * D], kt, vt, D, 16, first, valid, m[r], l[r], &acc[r * D], score.data(),
                          prob.data());
          } else {
            row_block<0>(&qf[r * D], kt, vt, D, BS, first, valid, m[r], l[r], &acc[r * D], score.data(),
                         prob.data());
          }
        }
      }
      for (int64_t i = 0; i < nq; ++i) {
        for (int64_t g = 0; g < G; ++g) {
          const int64_t r = i * G + g;
          const float inv = 1.0f / l[r];
          Q* o = op + ((q0 + i) * Hq + h * G + g) * D;
          for (int64_t d = 0; d < D; ++d) o[d] = static_cast<Q>(acc[r * D + d] * inv);
        }
      }
    }
  });
}
template <typename Q>
void by_cache(at::Tensor& out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& tables, const at::Tensor& rows, const at::Tensor& qstart,
              const at::Tensor& seqlens, double scale, double ks, double vs, int64_t w) {
  switch (k.scalar_type()) {
    case at::kFloat: return attend<Q, float>(out, q, k, v, tables, rows, qstart, seqlens, scale, ks, vs, w);
    case at::kBFloat16: return attend<Q, c10::BFloat16>(out, q, k, v, tables, rows, qstart, seqlens, scale, ks, vs, w);
    case at::kHalf: return attend<Q, c10::Half>(out, q, k, v, tables, rows, qstart, seqlens, scale, ks, vs, w);
    case at::kFloat8_e4m3fn:
      return attend<Q, c10::Float8_e4m3fn>(out, q, k, v, tables, rows, qstart, seqlens, scale, ks, vs, w);
    default: TORCH_CHECK(false, "paged_attention: unsupported KV cache dtype ", k.scalar_type());
  }
}

void paged_attention_window(at::Tensor out, const at::Tensor& q, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& tables, const at::Tensor& rows,
                            const at::Tensor& query_start, const at::Tensor& seq_lens, double scale,
                            double k_scale, double v_scale, int64_t window) {
  TORCH_CHECK(window >= 0, "paged_attention: window must be >= 0 (0: no window), got ", window);
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == q.size(2) && out.is_contiguous() && k_cache.is_contiguous() &&
              v_cache.is_contiguous(), "paged_attention: q rows must be dense [heads, head_dim], out and the caches contiguous");
  TORCH_CHECK(tables.scalar_type() == at::kInt && rows.scalar_type() == at::kInt &&
              query_start.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt,
              "paged_attention: tables, rows, query_start and seq_lens must be int32");
  TORCH_CHECK(k_cache.dim() == 4 && q.size(1) % k_cache.size(1) == 0, "paged_attention: query heads must divide by KV heads");
  switch (q.scalar_type()) {
    case at::kFloat: return by_cache<float>(out, q, k_cache, v_cache, tables, rows, query_start, seq_lens, scale, k_scale, v_scale, window);
    case at::kBFloat16: return by_cache<c10::BFloat16>(out, q, k_cache, v_cache, tables, rows, query_start, seq_lens, scale, k_scale, v_scale, window);
    case at::kHalf: return by_cache<c10::Half>(out, q, k_cache, v_cache, tables, rows, query_start, seq_lens, scale, k_scale, v_scale, window);
    default: TORCH_CHECK(false, "paged_attention: unsupported query dtype ", q.scalar_type());
  }
}

// Every earlier key: the signature every caller without a sliding window uses.
void paged_attention(at::Tensor out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& tables, const at::Tensor& rows, const at::Tensor& query_start,
                     const at::Tensor& seq_lens, double scale, double k_scale, double v_scale) {
  paged_attention_window(out, q, k_cache, v_cache, tables, rows, query_start, seq_lens, scale, k_scale, v_scale, 0);
}


// ---- fused elementwise kernels: one pass over memory where torch would make several ----------

template <typename T>
inline T round_to(float x) { return static_cast<T>(x); }

// With a residual: residual += x (rounded to T, as torch's add), then out = w * norm(residual).
// Without: out = w * norm(x). norm(h) = h / sqrt(mean(h^2) + eps), in float32, rounded to T before
// the weight multiplies it (as the model's RMSNorm does).
template <typename T>
void rms_norm_rows(T* out, T* x, T* residual, const T* w, int64_t rows, int64_t H, float eps) {
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> h(H);
    for (int64_t r = begin; r < end; ++r) {
      T* xr = x + r * H;
      if (residual != nullptr) {
        T* rr = residual + r * H;
        for (int64_t d = 0; d < H; ++d) {
          const T sum = round_to<T>(static_cast<float>(rr[d]) + static_cast<float>(xr[d]));
          rr[d] = sum;
          h[d] = static_cast<float>(sum);
        }
      } else {
        for (int64_t d = 0; d < H; ++d) h[d] = static_cast<float>(xr[d]);
      }
      float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
      for (int64_t d = 0; d < H; ++d) ss += h[d] * h[d];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(H) + eps);
      T* o = out + r * H;
      for (int64_t d = 0; d < H; ++d)
        o[d] = round_to<T>(static_cast<float>(w[d]) * static_cast<float>(round_to<T>(h[d] * inv)));
    }
  });
}

void rms_norm(at::Tensor out, at::Tensor x, c10::optional<at::Tensor> residual, const at::Tensor& weight,
              double eps) {
  TORCH_CHECK(x.is_contiguous() && out.is_contiguous() && weight.is_contiguous(), "rms_norm: contiguous tensors only");
  TORCH_CHECK(x.scalar_type() == weight.scalar_type() && out.scalar_type() == x.scalar_type(), "rms_norm: one dtype");
  const int64_t H = x.size(-1), rows = x.numel() / H;
  if (residual.has_value())
    TORCH_CHECK(residual->is_contiguous() && residual->sizes() == x.sizes() && residual->scalar_type() == x.scalar_type(),
                "rms_norm: the residual must match x");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm", [&] {
    scalar_t* res = residual.has_value() ? residual->data_ptr<scalar_t>() : nullptr;
    rms_norm_rows<scalar_t>(out.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), res, weight.data_ptr<scalar_t>(),
                            rows, H, static_cast<float>(eps));
  });
}

// silu(x) = x / (1 + exp(-x)); exp's argument is clamped at 88, where 1 / (1 + e^88) is already 0
// in float32 (the polynomial exp is exact in form for |x| <= 88 and vectorises; libm's would not).
inline float silu(float x) { return x / (1.0f + exp_neg(std::min(-x, 88.0f))); }

// out[r] = silu(gate_up[r, :I]) * gate_up[r, I:] (each product rounded to T, as torch's two ops).
template <typename T>
void silu_and_mul_rows(T* o, const T* gu, int64_t rows, int64_t I) {
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gu + r * 2 * I;
      const T* u = g + I;
      T* orow = o + r * I;
#pragma omp simd
      for (int64_t j = 0; j < I; ++j) {
        const float act = static_cast<float>(round_to<T>(silu(static_cast<float>(g[j]))));
        orow[j] = round_to<T>(act * static_cast<float>(u[j]));
      }
    }
  });
}

void silu_and_mul(at::Tensor out, const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.is_contiguous() && out.is_contiguous(), "silu_and_mul: contiguous tensors only");
  const int64_t I = out.size(-1), rows = out.numel() / I;
  TORCH_CHECK(gate_up.size(-1) == 2 * I && gate_up.numel() == 2 * out.numel(), "silu_and_mul: gate_up must be [.., 2 * I]");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, out.scalar_type(), "silu_and_mul", [&] {
    silu_and_mul_rows<scalar_t>(out.data_ptr<scalar_t>(), gate_up.data_ptr<scalar_t>(), rows, I);
  });
}

// Rotary embedding of q (in place) and k, and k, v written at their cache slots, in one pass.
// q, k, v: [tokens, heads, head_dim] with dense rows (views into the qkv projection); cos, sin:
// [positions, head_dim] float32; the caches in the CPU kernel's layout, of the activations' dtype.
template <typename T>
inline void rotate(const T* x, T* dst, int64_t dst_stride, const float* c, const float* s, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t d = 0; d < half; ++d) {
    const float x1 = static_cast<float>(x[d]), x2 = static_cast<float>(x[d + half]);
    const float c1 = static_cast<float>(round_to<T>(c[d])), c2 = static_cast<float>(round_to<T>(c[d + half]));
    const float s1 = static_cast<float>(round_to<T>(s[d])), s2 = static_cast<float>(round_to<T>(s[d + half]));
    dst[d * dst_stride] = round_to<T>(static_cast<float>(round_to<T>(x1 * c1)) + static_cast<float>(round_to<T>(-x2 * s1)));
    dst[(d + half) * dst_stride] =
        round_to<T>(static_cast<float>(round_to<T>(x2 * c2)) + static_cast<float>(round_to<T>(x1 * s2)));
  }
}

void rotary_and_cache(at::Tensor q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                      const at::Tensor& cos, const at::Tensor& sin, at::Tensor k_cache, at::Tensor v_cache,
                      const at::Tensor& slots) {
  const int64_t T_ = q.size(0), Hq = q.size(1), D = q.size(2), KVH = k.size(1);
  const int64_t BS = k_cache.size(3);
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1 && q.stride(1) == D && k.stride(1) == D &&
              v.stride(1) == D, "rotary_and_cache: q, k, v rows must be dense [heads, head_dim]");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && cos.is_contiguous() && sin.is_contiguous() &&
              cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat, "rotary_and_cache: contiguous tables and caches");
  TORCH_CHECK(positions.scalar_type() == at::kLong && slots.scalar_type() == at::kLong, "rotary_and_cache: int64 positions and slots");
  TORCH_CHECK(k_cache.scalar_type() == q.scalar_type() && D % 2 == 0, "rotary_and_cache: the cache must have q's dtype");
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t qs = q.stride(0), ks = k.stride(0), vs = v.stride(0);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "rotary_and_cache", [&] {
    scalar_t* qp = q.data_ptr<scalar_t>();
    const scalar_t* kp = k.data_ptr<scalar_t>();
    const scalar_t* vp = v.data_ptr<scalar_t>();
    scalar_t* kc = k_cache.data_ptr<scalar_t>();
    scalar_t* vc = v_cache.data_ptr<scalar_t>();
    const float* cp = cos.data_ptr<float>();
    const float* sp = sin.data_ptr<float>();
    at::parallel_for(0, T_, 16, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> tmp(D);
      for (int64_t t = begin; t < end; ++t) {
        const float* c = cp + pos[t] * D;
        const float* s = sp + pos[t] * D;
        for (int64_t h = 0; h < Hq; ++h) {
          scalar_t* row = qp + t * qs + h * D;
          rotate(row, tmp.data(), 1, c, s, D);
          std::memcpy(row, tmp.data(), D * sizeof(scalar_t));
        }
        const int64_t block = slot[t] / BS, off = slot[t] % BS;
        for (int64_t h = 0; h < KVH; ++h) {
          // K tile [head_dim, block_size]: element d of this token at d * BS + off.
          rotate(kp + t * ks + h * D, kc + ((block * KVH + h) * D) * BS + off, BS, c, s, D);
          std::memcpy(vc + ((block * KVH + h) * BS + off) * D, vp + t * vs + h * D, D * sizeof(scalar_t));
        }
      }
    });
  });
}

// ---- GEMM for a linear layer: out[M, N] = x[M, K] . W^T (* scale) (+ bias) ----------------------
// W is packed once into panels of 32 output columns, [P, K, 32] (panel p holds columns 32p..32p+31,
// row k of the panel being W[32p:32p+32, k]), so a K step of a panel is two 64-byte vectors of
// float32 weights, or 32 bytes of int8 weights.
// The microkernel keeps an 8 x 32 tile of the output in 16 registers; a K block of a panel (128
// steps, 16 KB) stays in L1 while every 8-row tile of the step's rows uses it. Few rows (decode)
// and the weights stream from memory once per call, so the kernel prefetches the next block into
// L1 and the one after into L2 while it computes, each tile a share of the lines spread evenly
// over its K steps: issued in bursts, the prefetches filled the core's line-fill buffers, the
// FMAs' own loads waited behind them, and memory time added to compute time instead of hiding
// under it (32 rows: 200 GFLOPS in bursts, 277 spread). Each output is summed over k in the order
// 0..K-1 whatever M or the tiling is (partial sums pass through the output in float32), so a
// row's result never depends on the batch it is in.
//
// Int8 weights (weight-only quantization, one symmetric scale per output column) use the same
// tiles: each K step widens its 32 int8 weights to float32 in registers and the FMAs run as for
// float32 weights, so the sum over k is exact in the integer weights; the column's scale
// multiplies the finished sum once, at the last K block. A decode step reads a quarter of the
// bytes of the float32 weights, which is what bounds it.
#if defined(__AVX512F__)
#define FRONTIER_PANEL_GEMM 1

constexpr int64_t NR = 32;         // output columns per panel
constexpr int64_t MR = 8;          // rows per register tile
constexpr int64_t KC = 128;        // K steps per block
constexpr int64_t ROWS_SPLIT = 128;  // rows per thread above which threads split rows, not panels

// The 32 weights of one K step of a panel, as two vectors of 16 float32 columns.
inline void panel_step(const float* b, __m512& b0, __m512& b1) {
  b0 = _mm512_load_ps(b);
  b1 = _mm512_load_ps(b + 16);
}

inline void panel_step(const int8_t* b, __m512& b0, __m512& b1) {
  b0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b))));
  b1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16))));
}

template <int R, typename W>
inline void gemm_tile(const float* a, int64_t lda, const W* b, int64_t kc, float* c, int64_t ldc,
                      __mmask16 m0, __mmask16 m1, bool first, const float* scale, const float* bias,
                      const W* pf1, const W* pf2, int64_t pf_n) {
  constexpr int64_t LINE = 64 / sizeof(W);  // weights per cache line
  __m512 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) {
    acc0[r] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m0, c + r * ldc);
    acc1[r] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(m1, c + r * ldc + 16);
  }
  // This tile's share of the weights ahead (pf_n lines), spread evenly over its K steps: a burst
  // of misses would fill the core's line-fill buffers and stall the loads the FMAs wait on.
  // (Bresenham: a line each time the running sum of pf_n passes another kc.)
  int64_t due = 0;
  for (int64_t k = 0; k < kc; ++k) {
    for (due += pf_n; due >= kc; due -= kc) {
      if (pf1 != nullptr) _mm_prefetch(reinterpret_cast<const char*>(pf1), _MM_HINT_T0);
      if (pf2 != nullptr) _mm_prefetch(reinterpret_cast<const char*>(pf2), _MM_HINT_T1);
      pf1 = pf1 != nullptr ? pf1 + LINE : nullptr;
      pf2 = pf2 != nullptr ? pf2 + LINE : nullptr;
    }
    __m512 b0, b1;
    panel_step(b + k * NR, b0, b1);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a[r * lda + k]);
      acc0[r] = _mm512_fmadd_ps(x, b0, acc0[r]);
      acc1[r] = _mm512_fmadd_ps(x, b1, acc1[r]);
    }
  }
  if (scale != nullptr) {
    const __m512 s0 = _mm512_maskz_loadu_ps(m0, scale), s1 = _mm512_maskz_loadu_ps(m1, scale + 16);
    for (int r = 0; r < R; ++r) {
      acc0[r] = _mm512_mul_ps(acc0[r], s0);
      acc1[r] = _mm512_mul_ps(acc1[r], s1);
    }
  }
  if (bias != nullptr) {
    const __m512 bias0 = _mm512_maskz_loadu_ps(m0, bias), bias1 = _mm512_maskz_loadu_ps(m1, bias + 16);
    for (int r = 0; r < R; ++r) {
      acc0[r] = _mm512_add_ps(acc0[r], bias0);
      acc1[r] = _mm512_add_ps(acc1[r], bias1);
    }
  }
  for (int r = 0; r < R; ++r) {
    _mm512_mask_storeu_ps(c + r * ldc, m0, acc0[r]);
    _mm512_mask_storeu_ps(c + r * ldc + 16, m1, acc1[r]);
  }
}

template <typename W>
using GemmTile = void (*)(const float*, int64_t, const W*, int64_t, float*, int64_t, __mmask16, __mmask16, bool,
                          const float*, const float*, const W*, const W*, int64_t);
template <typename W>
constexpr GemmTile<W> GEMM_TILES[MR + 1] = {nullptr,           gemm_tile<1, W>, gemm_tile<2, W>,
                                            gemm_tile<3, W>,   gemm_tile<4, W>, gemm_tile<5, W>,
                                            gemm_tile<6, W>,   gemm_tile<7, W>, gemm_tile<8, W>};

inline __mmask16 lanes(int64_t n) { return n >= 16 ? 0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }

// out = x . W^T for panels ``wp`` [P, K, 32] of weight type W; ``sp`` (per column) scales the sums
// and ``bp`` is added last, either may be null.
template <typename W>
void panel_gemm_run(float* cp, const float* ap, int64_t lda, const W* wp, const float* sp, const float* bp,
                    int64_t M, int64_t K, int64_t P, int64_t N) {
  // Rows a pass keeps in L2 (about 1 MB of x) while the panels stream past, in chunks of equal
  // size: a short last chunk would stream every weight again for a few rows.
  const int64_t mc_max = std::max<int64_t>(MR, ((1 << 20) / (4 * K)) / MR * MR);
  auto chunk = [&](int64_t rows) {
    const int64_t chunks = (rows + mc_max - 1) / mc_max;
    return ((rows + chunks - 1) / chunks + MR - 1) / MR * MR;
  };
  constexpr int64_t LINE = 64 / sizeof(W);

  // Panels [p0, p1) of rows [r0, r1), a chunk of at most mc rows at a time.
  auto run = [&](int64_t r0, int64_t r1, int64_t p0, int64_t p1, int64_t mc) {
    const W* stop = wp + p1 * K * NR;  // the end of this thread's panels
    for (int64_t m0 = r0; m0 < r1; m0 += mc) {
      const int64_t m1 = std::min(r1, m0 + mc);
      const int64_t tiles = (m1 - m0 + MR - 1) / MR;
      for (int64_t p = p0; p < p1; ++p) {
        const __mmask16 lo = lanes(N - p * NR), hi = lanes(N - p * NR - 16);
        const W* panel = wp + p * K * NR;
        for (int64_t kb = 0; kb < K; kb += KC) {
          const int64_t kc = std::min(KC, K - kb);
          const bool last = kb + kc >= K;
          // The thread's panels lie end to end, so the weights it reads next are the bytes that
          // follow this block: each row tile prefetches its share of the blocks ahead.
          const W* here = panel + kb * NR;
          const int64_t lines = (kc * NR + LINE - 1) / LINE;   // cache lines of a block
          const int64_t share = (lines + tiles - 1) / tiles;   // of them per tile
          for (int64_t m = m0, t = 0; m < m1; m += MR, ++t) {
            const int64_t rows = std::min(MR, m1 - m);
            const W* a1 = here + kc * NR + t * share * LINE;  // the next block, into L1
            const W* a2 = a1 + KC * NR;                       // the one after, into L2
            const W* pf1 = a1 < stop ? a1 : nullptr;
            const W* pf2 = a2 < stop ? a2 : nullptr;
            GEMM_TILES<W>[rows](ap + m * lda + kb, lda, here, kc, cp + m * N + p * NR, N, lo, hi, kb == 0,
                                last && sp != nullptr ? sp + p * NR : nullptr,
                                last && bp != nullptr ? bp + p * NR : nullptr, pf1, pf2, share);
          }
        }
      }
    }
  };
  const int64_t threads = at::get_num_threads();
  if (M >= ROWS_SPLIT * threads) {
    // Many rows: each thread takes its own rows and every panel. It is compute-bound, so reading
    // the weights once per chunk costs less than two threads sharing each chunk of rows would.
    const int64_t per = (M + threads - 1) / threads;
    at::parallel_for(0, M, per, [&](int64_t r0, int64_t r1) { run(r0, r1, 0, P, chunk(per)); });
  } else {
    at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) { run(0, M, p0, p1, chunk(M)); });
  }
}

void check_panel_shapes(const char* op, const at::Tensor& out, const at::Tensor& x, const at::Tensor& w,
                        const c10::optional<at::Tensor>& bias) {
  const int64_t M = x.size(0), K = x.size(1), P = w.size(0), N = out.size(1);
  TORCH_CHECK(x.dim() == 2 && w.dim() == 3 && out.dim() == 2, op, ": x [M, K], panels [P, K, 32], out [M, N]");
  TORCH_CHECK(x.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat, op, ": float32 x and out only");
  TORCH_CHECK(x.stride(1) == 1 && w.is_contiguous() && out.is_contiguous() && w.size(1) == K && w.size(2) == NR &&
              out.size(0) == M && P * NR >= N && (P - 1) * NR < N, op, ": shapes do not match");
  TORCH_CHECK(!bias.has_value() || (bias->is_contiguous() && bias->scalar_type() == at::kFloat && bias->numel() == N),
              op, ": bias must be N contiguous floats");
}

void panel_linear(at::Tensor out, const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  check_panel_shapes("panel_linear", out, x, w, bias);
  TORCH_CHECK(w.scalar_type() == at::kFloat, "panel_linear: float32 panels only");
  panel_gemm_run<float>(out.data_ptr<float>(), x.data_ptr<float>(), x.stride(0), w.data_ptr<float>(), nullptr,
                        bias.has_value() ? bias->data_ptr<float>() : nullptr, x.size(0), x.size(1), w.size(0),
                        out.size(1));
}

void panel_linear_int8(at::Tensor out, const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale,
                       const c10::optional<at::Tensor>& bias) {
  check_panel_shapes("panel_linear_int8", out, x, w, bias);
  TORCH_CHECK(w.scalar_type() == at::kChar, "panel_linear_int8: int8 panels only");
  TORCH_CHECK(scale.is_contiguous() && scale.scalar_type() == at::kFloat && scale.numel() == out.size(1),
              "panel_linear_int8: scale must be N contiguous floats");
  panel_gemm_run<int8_t>(out.data_ptr<float>(), x.data_ptr<float>(), x.stride(0), w.data_ptr<int8_t>(),
                         scale.data_ptr<float>(), bias.has_value() ? bias->data_ptr<float>() : nullptr, x.size(0),
                         x.size(1), w.size(0), out.size(1));
}

// ---- bfloat16 GEMM with native bf16 dot products (the avx512bf16 variant) -----------------------
// Where the CPU has AVX512-BF16, a bf16 layer keeps its weights in bf16: packed into panels of 32
// columns by pairs of K steps, [P, K/2, 32, 2] (element (p, kk, j, t) = W[32p + j, 2kk + t]), so
// one K pair of a panel is two 64-byte vectors and _mm512_dpbf16_ps multiplies each by a pair of
// one row's activations broadcast to every lane, summing both products into the float32 lane of
// its column. Half the bytes of the float32 copy the other variants widen bf16 weights into (a
// decode step streams every weight once, so it reads half as much), and no widening of the
// activations either. The tile, blocking and prefetching are those of the float32 GEMM above, a K
// block being 256 steps (16 KB of bf16). Partial sums of a chunk of rows stay in a float32 scratch
// of 32 columns while its K blocks pass; at the last block the bias (float32) is added and each
// output rounded once to bf16 (round to nearest even, as torch rounds), or written in float32 (the
// logits: rounding them to bf16 would move a logprob by up to 2**-8 of the logit). The products are exact in
// float32 and summed in the order k = 0, 1, 2, ... (each pair's two products first), so a row's
// result never depends on its batch either.
#if defined(__AVX512BF16__)
#define FRONTIER_PANEL_GEMM_BF16 1

constexpr int64_t KC16 = 256;  // K steps per block (even)

template <int R>
inline void gemm_tile_bf16(const uint16_t* a, int64_t lda, const uint16_t* b, int64_t kc, float* c,
                           uint16_t* o, float* of, int64_t ldo, __mmask16 m0, __mmask16 m1, bool first,
                           const float* bias, const uint16_t* pf1, const uint16_t* pf2, int64_t pf_n) {
  constexpr int64_t LINE = 32;  // bf16 weights per cache line
  __m512 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) {
    acc0[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * NR);
    acc1[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + r * NR + 16);
  }
  const int64_t pairs = kc / 2;
  int64_t due = 0;
  for (int64_t kk = 0; kk < pairs; ++kk) {
    for (due += pf_n; due >= pairs; due -= pairs) {
      if (pf1 != nullptr) _mm_prefetch(reinterpret_cast<const char*>(pf1), _MM_HINT_T0);
      if (pf2 != nullptr) _mm_prefetch(reinterpret_cast<const char*>(pf2), _MM_HINT_T1);
      pf1 = pf1 != nullptr ? pf1 + LINE : nullptr;
      pf2 = pf2 != nullptr ? pf2 + LINE : nullptr;
    }
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + kk * 2 * NR);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + kk * 2 * NR + NR);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      int32_t pair;
      std::memcpy(&pair, a + r * lda + 2 * kk, sizeof(pair));
      const __m512bh x = (__m512bh)_mm512_set1_epi32(pair);
      acc0[r] = _mm512_dpbf16_ps(acc0[r], x, b0);
      acc1[r] = _mm512_dpbf16_ps(acc1[r], x, b1);
    }
  }
  if (o == nullptr && of == nullptr) {  // not the last block: the partial sums wait in the scratch
    for (int r = 0; r < R; ++r) {
      _mm512_storeu_ps(c + r * NR, acc0[r]);
      _mm512_storeu_ps(c + r * NR + 16, acc1[r]);
    }
    return;
  }
  if (bias != nullptr) {
    const __m512 bias0 = _mm512_maskz_loadu_ps(m0, bias), bias1 = _mm512_maskz_loadu_ps(m1, bias + 16);
    for (int r = 0; r < R; ++r) {
      acc0[r] = _mm512_add_ps(acc0[r], bias0);
      acc1[r] = _mm512_add_ps(acc1[r], bias1);
    }
  }
  if (of != nullptr) {  // float32 out (logits): the sums as they are
    for (int r = 0; r < R; ++r) {
      _mm512_mask_storeu_ps(of + r * ldo, m0, acc0[r]);
      _mm512_mask_storeu_ps(of + r * ldo + 16, m1, acc1[r]);
    }
    return;
  }
  for (int r = 0; r < R; ++r) {
    _mm256_mask_storeu_epi16(o + r * ldo, m0, (__m256i)_mm512_cvtneps_pbh(acc0[r]));
    _mm256_mask_storeu_epi16(o + r * ldo + 16, m1, (__m256i)_mm512_cvtneps_pbh(acc1[r]));
  }
}

using GemmTileBf16 = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, float*, uint16_t*, float*, int64_t,
                              __mmask16, __mmask16, bool, const float*, const uint16_t*, const uint16_t*, int64_t);
constexpr GemmTileBf16 GEMM_TILES_BF16[MR + 1] = {
    nullptr, gemm_tile_bf16<1>, gemm_tile_bf16<2>, gemm_tile_bf16<3>, gemm_tile_bf16<4>,
    gemm_tile_bf16<5>, gemm_tile_bf16<6>, gemm_tile_bf16<7>, gemm_tile_bf16<8>};

// out = x (bf16) . W^T + bias for panels ``wp`` [P, K/2, 32, 2], into bf16 ``op`` or else float32 ``fp``;
// K even, ``bp`` may be null.
void panel_gemm_run_bf16(uint16_t* op, float* fp, const uint16_t* ap, int64_t lda, const uint16_t* wp, const float* bp,
                         int64_t M, int64_t K, int64_t P, int64_t N) {
  const int64_t mc_max = std::max<int64_t>(MR, ((1 << 20) / (2 * K)) / MR * MR);
  auto chunk = [&](int64_t rows) {
    const int64_t chunks = (rows + mc_max - 1) / mc_max;
    return ((rows + chunks - 1) / chunks + MR - 1) / MR * MR;
  };
  constexpr int64_t LINE = 32;
  auto run = [&](int64_t r0, int64_t r1, int64_t p0, int64_t p1, int64_t mc) {
    std::vector<float> scratch(static_cast<size_t>(std::min(mc, r1 - r0) + MR) * NR);
    const uint16_t* stop = wp + p1 * K * NR;
    for (int64_t m0 = r0; m0 < r1; m0 += mc) {
      const int64_t m1 = std::min(r1, m0 + mc);
      const int64_t tiles = (m1 - m0 + MR - 1) / MR;
      for (int64_t p = p0; p < p1; ++p) {
        const __mmask16 lo = lanes(N - p * NR), hi = lanes(N - p * NR - 16);
        const uint16_t* panel = wp + p * K * NR;
        for (int64_t kb = 0; kb < K; kb += KC16) {
          const int64_t kc = std::min(KC16, K - kb);
          const bool last = kb + kc >= K;
          const uint16_t* here = panel + kb * NR;
          const int64_t lines = (kc * NR + LINE - 1) / LINE;
          const int64_t share = (lines + tiles - 1) / tiles;
          for (int64_t m = m0, t = 0; m < m1; m += MR, ++t) {
            const int64_t rows = std::min(MR, m1 - m);
            const uint16_t* a1 = here + kc * NR + t * share * LINE;
            const uint16_t* a2 = a1 + KC16 * NR;
            GEMM_TILES_BF16[rows](ap + m * lda + kb, lda, here, kc, scratch.data() + (m - m0) * NR,
                                  last && op != nullptr ? op + m * N + p * NR : nullptr,
                                  last && fp != nullptr ? fp + m * N + p * NR : nullptr, N, lo, hi, kb == 0,
                                  last && bp != nullptr ? bp + p * NR : nullptr, a1 < stop ? a1 : nullptr,
                                  a2 < stop ? a2 : nullptr, share);
          }
        }
      }
    }
  };
  const int64_t threads = at::get_num_threads();
  if (M >= ROWS_SPLIT * threads) {
    const int64_t per = (M + threads - 1) / threads;
    at::parallel_for(0, M, per, [&](int64_t r0, int64_t r1) { run(r0, r1, 0, P, chunk(per)); });
  } else {
    at::parallel_for(0, P, 1, [&](int64_t p0, int64_t p1) { run(0, M, p0, p1, chunk(M)); });
  }
}

void panel_linear_bf16(at::Tensor out, const at::Tensor& x, const at::Tensor& w,
                       const c10::optional<at::Tensor>& bias) {
  const int64_t M = x.size(0), K = x.size(1), N = out.size(1);
  TORCH_CHECK(x.dim() == 2 && w.dim() == 4 && out.dim() == 2,
              "panel_linear_bf16: x [M, K], panels [P, K/2, 32, 2], out [M, N]");
  const bool f32 = out.scalar_type() == at::kFloat;
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && (f32 || out.scalar_type() == at::kBFloat16) &&
              w.scalar_type() == at::kBFloat16, "panel_linear_bf16: bfloat16 x and panels, bfloat16 or float out");
  const int64_t P = w.size(0);
  TORCH_CHECK(K % 2 == 0 && x.stride(1) == 1 && w.is_contiguous() && out.is_contiguous() && w.size(1) * 2 == K &&
              w.size(2) == NR && w.size(3) == 2 && out.size(0) == M && P * NR >= N && (P - 1) * NR < N,
              "panel_linear_bf16: shapes do not match");
  TORCH_CHECK(!bias.has_value() || (bias->is_contiguous() && bias->scalar_type() == at::kFloat && bias->numel() == N),
              "panel_linear_bf16: bias must be N contiguous floats");
  panel_gemm_run_bf16(f32 ? nullptr : reinterpret_cast<uint16_t*>(out.data_ptr()),
                      f32 ? out.data_ptr<float>() : nullptr, reinterpret_cast<const uint16_t*>(x.data_ptr()),
                      x.stride(0), reinterpret_cast<const uint16_t*>(w.data_ptr()),
                      bias.has_value() ? bias->data_ptr<float>() : nullptr, M, K, P, N);
}
#endif  // __AVX512BF16__
#else
void panel_linear(at::Tensor, const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&) {
  TORCH_CHECK(false, "panel_linear: built without AVX-512");
}

void panel_linear_int8(at::Tensor, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                       const c10::optional<at::Tensor>&) {
  TORCH_CHECK(false, "panel_linear_int8: built without AVX-512");
}
#endif

#if !defined(FRONTIER_PANEL_GEMM_BF16)
void panel_linear_bf16(at::Tensor, const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&) {
  TORCH_CHECK(false, "panel_linear_bf16: built without AVX512-BF16");
}
#endif

// Pins intra-op thread i (OpenMP thread i of torch's pool; 0 is the calling thread) to cpus[i].
// at::parallel_for over as many items as threads hands each thread exactly one item.
void bind_threads(at::IntArrayRef cpus) {
  const int64_t n = at::get_num_threads();
  TORCH_CHECK(static_cast<int64_t>(cpus.size()) == n, "bind_threads: ", cpus.size(), " CPUs for ", n, " threads");
  std::atomic<int> failed{0};
  at::parallel_for(0, n, 1, [&](int64_t, int64_t) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(static_cast<int>(cpus[at::get_thread_num()]), &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof(set), &set) != 0) failed.fetch_add(1);
  });
  TORCH_CHECK(failed.load() == 0, "bind_threads: the kernel refused ", failed.load(), " of the pins");
}

bool panel_gemm() {
#ifdef FRONTIER_PANEL_GEMM
  return true;
#else
  return false;
#endif
}

bool panel_gemm_bf16() {
#ifdef FRONTIER_PANEL_GEMM_BF16
  return true;
#else
  return false;
#endif
}

}  // namespace

TORCH_LIBRARY(frontier, m) {
  m.def("paged_attention(Tensor(a!) out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor tables, Tensor rows, "
        "Tensor query_start, Tensor seq_lens, float scale, float k_scale, float v_scale) -> ()");
  m.def("paged_attention_window(Tensor(a!) out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor tables, "
        "Tensor rows, Tensor query_start, Tensor seq_lens, float scale, float k_scale, float v_scale, "
        "int window) -> ()");
  m.def("rms_norm(Tensor(a!) out, Tensor(b!) x, Tensor(c!)? residual, Tensor weight, float eps) -> ()");
  m.def("silu_and_mul(Tensor(a!) out, Tensor gate_up) -> ()");
  m.def("rotary_and_cache(Tensor(a!) q, Tensor k, Tensor v, Tensor positions, Tensor cos, Tensor sin, "
        "Tensor(b!) k_cache, Tensor(c!) v_cache, Tensor slots) -> ()");
  m.def("panel_linear(Tensor(a!) out, Tensor x, Tensor panels, Tensor? bias) -> ()");
  m.def("panel_linear_int8(Tensor(a!) out, Tensor x, Tensor panels, Tensor scale, Tensor? bias) -> ()");
  m.def("panel_linear_bf16(Tensor(a!) out, Tensor x, Tensor panels, Tensor? bias) -> ()");
  m.def("panel_gemm() -> bool", &panel_gemm);
  m.def("panel_gemm_bf16() -> bool", &panel_gemm_bf16);
  m.def("bind_threads(int[] cpus) -> ()", &bind_threads);
}

TORCH_LIBRARY_IMPL(frontier, CPU, m) {
  m.impl("paged_attention", &paged_attention);
  m.impl("paged_attention_window", &paged_attention_window);
  m.impl("rms_norm", &rms_norm);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("rotary_and_cache", &rotary_and_cache);
  m.impl("panel_linear", &panel_linear);
  m.impl("panel_linear_int8", &panel_linear_int8);
  m.impl("panel_linear_bf16", &panel_linear_bf16);
}
