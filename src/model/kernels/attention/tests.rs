use super::super::panel::tests::lcg;
use super::*;

/// Textbook attention in f64 with an explicit mask.
fn naive(q: &[f32], k: &[f32], v: &[f32], s: AttentionShape, scale: f64, w: usize) -> Vec<f64> {
    let AttentionShape {
        batch,
        heads,
        kv_heads,
        t,
        head_dim: d,
    } = s;
    let mut y = vec![0f64; batch * t * heads * d];
    for b in 0..batch {
        for h in 0..heads {
            let kv = b * kv_heads + h / (heads / kv_heads);
            for i in 0..t {
                let qi = &q[((b * heads + h) * t + i) * d..][..d];
                let js: Vec<usize> = (0..=i).filter(|&j| i - j < w).collect();
                let sc: Vec<f64> = js
                    .iter()
                    .map(|&j| {
                        let kj = &k[(kv * t + j) * d..][..d];
                        qi.iter()
                            .zip(kj)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for dd in 0..d {
                    y[((b * t + i) * heads + h) * d + dd] = js
                        .iter()
                        .zip(&e)
                        .map(|(&j, &p)| p / z * v[(kv * t + j) * d + dd] as f64)
                        .sum();
                }
            }
        }
    }
    y
}

/// Every level stores the same scaled scores and finds the same maxima over each query's
/// visible keys (a sliding window included) as the portable definition, whether a
/// query's keys come in one call or in two: with NaN and infinite keys, an all-zero query
/// (every score ±0, by the sign of the scale) and queries whose visible keys begin or end
/// inside a vector.
#[test]
fn scores_and_maxima_are_the_same_at_every_level() {
    use super::super::panel::tests::available_isas;
    let mut seed = 7;
    // A head size that is no multiple of a vector (the kernels' vectors run over keys).
    let (t, d, cols) = (70, 12, 80);
    let mut q: Vec<f32> = (0..t * d).map(|_| lcg(&mut seed) * 4.0 - 2.0).collect();
    q[21 * d..22 * d].fill(0.0);
    let mut kt = vec![0f32; d * cols];
    for j in 0..t {
        for dd in 0..d {
            kt[kt_index(d, j, dd)] = match (j % 23, dd) {
                (5, 3) => f32::NAN,
                (9, 0) => f32::INFINITY,
                _ => lcg(&mut seed) * 2.0 - 1.0,
            };
        }
    }
    let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
    for (scale, window) in [(0.3, usize::MAX), (-0.25, 5), (0.125, 17)] {
        for isa in available_isas() {
            let head = Head {
                q: &q,
                kt: &kt,
                v: &[],
                d,
                cols,
                scale,
                window,
                isa,
            };
            let portable = Head {
                isa: super::super::Isa::Portable,
                ..head
            };
            for (first, live) in [
                (0usize, 4usize),
                (17, 4),
                (20, 3),
                (37, 4),
                (66, 4),
                (69, 1),
            ] {
                let lo = (first + 1).saturating_sub(window) / 16 * 16;
                let hi = (first + live).div_ceil(16) * 16;
                let mid = (lo + hi) / 32 * 16;
                let mut want = (vec![0f32; QUERY_GROUP * cols], [f32::NEG_INFINITY; 4]);
                portable.scores(first, live, lo..hi, &mut want.0, &mut want.1);
                let mut got = (vec![0f32; QUERY_GROUP * cols], [f32::NEG_INFINITY; 4]);
                head.scores(first, live, lo..mid, &mut got.0, &mut got.1);
                head.scores(first, live, mid..hi, &mut got.0, &mut got.1);
                for r in 0..live {
                    let visible = head.visible(first + r);
                    let max = want.0[r * cols..][visible]
                        .iter()
                        .fold(f32::NEG_INFINITY, |m, &s| m.max(s));
                    let at = format!("{isa:?} scale {scale} window {window} query {}", first + r);
                    assert!(same(want.1[r], max), "portable maximum, {at}");
                    assert!(same(got.1[r], max), "maximum, {at}");
                    let row = |x: &[f32]| x[r * cols + lo..r * cols + hi].to_vec();
                    let equal = row(&got.0)
                        .iter()
                        .zip(&row(&want.0))
                        .all(|(&a, &b)| same(a, b));
                    assert!(equal, "scores, {at}");
                }
            }
        }
    }
}

#[test]
fn matches_naive_attention_on_odd_shapes() {
    let mut seed = 29;
    for (shape, window) in [
        (
            AttentionShape {
                batch: 1,
                heads: 1,
                kv_heads: 1,
                t: 1,
                head_dim: 8,
            },
            None,
        ),
        (
            AttentionShape {
                batch: 2,
                heads: 3,
                kv_heads: 1,
                t: 37,
                head_dim: 16,
            },
            None,
        ),
        (
            AttentionShape {
                batch: 1,
                heads: 4,
                kv_heads: 2,
                t: 70,
                head_dim: 24,
            },
            Some(9),
        ),
        (
            AttentionShape {
                batch: 1,
                heads: 2,
                kv_heads: 2,
                t: 45,
                head_dim: 12,
            },
            Some(1),
        ),
        (
            AttentionShape {
                batch: 1,
                heads: 2,
                kv_heads: 1,
                t: 130,
                head_dim: 72,
            },
            None,
        ),
    ] {
        let q: Vec<f32> = (0..shape.q_len()).map(|_| lcg(&mut seed) * 2.0).collect();
        let k: Vec<f32> = (0..shape.kv_len()).map(|_| lcg(&mut seed) * 2.0).collect();
        let v: Vec<f32> = (0..k.len()).map(|_| lcg(&mut seed)).collect();
        let scale = 1.0 / (shape.head_dim as f32).sqrt();
        let got = causal_attention(&q, &k, &v, shape, scale, window);
        let want = naive(
            &q,
            &k,
            &v,
            shape,
            scale as f64,
            window.unwrap_or(usize::MAX),
        );
        for (i, (&g, &e)) in got.iter().zip(&want).enumerate() {
            assert!((g as f64 - e).abs() < 2e-5, "{shape:?} [{i}] {g} vs {e}");
        }
    }
}

#[test]
fn a_sequence_does_not_depend_on_its_batch_mates() {
    let mut seed = 31;
    let s = AttentionShape {
        batch: 3,
        heads: 3,
        kv_heads: 3,
        t: 40,
        head_dim: 16,
    };
    let n = s.heads * s.t * s.head_dim;
    let q: Vec<f32> = (0..3 * n).map(|_| lcg(&mut seed)).collect();
    let k: Vec<f32> = (0..3 * n).map(|_| lcg(&mut seed)).collect();
    let v: Vec<f32> = (0..3 * n).map(|_| lcg(&mut seed)).collect();
    let all = causal_attention(&q, &k, &v, s, 0.25, None);
    let one = AttentionShape { batch: 1, ..s };
    let second = causal_attention(&q[n..2 * n], &k[n..2 * n], &v[n..2 * n], one, 0.25, None);
    assert_eq!(&all[n..2 * n], second.as_slice());
}

/// Time of one Llama-3.2-1B layer's attention (32 heads, 8 KV heads, d 64, t 512 or
/// `PPL_BENCH_T`) at the process's level, the fastest of `PPL_BENCH_REPS` runs (default 3);
/// compare with `PPL_ISA=avx2`:
/// `cargo test --release --lib attention::tests::throughput -- --ignored --nocapture`.
#[test]
#[ignore]
fn throughput() {
    let mut seed = 41;
    let t = std::env::var("PPL_BENCH_T")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(512);
    let s = AttentionShape {
        batch: 1,
        heads: 32,
        kv_heads: 8,
        t,
        head_dim: 64,
    };
    let q: Vec<f32> = (0..s.q_len()).map(|_| lcg(&mut seed)).collect();
    let k: Vec<f32> = (0..s.kv_len()).map(|_| lcg(&mut seed)).collect();
    let v: Vec<f32> = (0..s.kv_len()).map(|_| lcg(&mut seed)).collect();
    let reps = crate::test_util::bench_count("PPL_BENCH_REPS", 3);
    let best = (0..reps)
        .map(|_| {
            let t = std::time::Instant::now();
            std::hint::black_box(causal_attention(&q, &k, &v, s, 0.125, None));
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    // Two multiply-adds (score, weighted value) per head, visible key and head value.
    let flops = 4.0 * (s.heads * s.head_dim) as f64 * (t * (t + 1) / 2) as f64;
    println!(
        "attention {s:?}, {} kernels: {:.2} ms, {:.1} GFLOP/s",
        super::super::isa().name(),
        best * 1e3,
        flops / best / 1e9
    );
}

/// The keys a full group's queries all see, within any range of keys, and none for a
/// group that is not full: checked key by key against each query's span.
#[test]
fn shared_keys_are_the_keys_every_query_sees() {
    let spans = [(3, 9), (5, 12), (5, 10), (7, 15)];
    let probs: Vec<Vec<f32>> = spans.iter().map(|&(a, b)| vec![0.5; b - a]).collect();
    for live in [3, 4] {
        let group = ValueGroup::new(
            std::array::from_fn(|r| if r < live { &probs[r][..] } else { &[] }),
            std::array::from_fn(|r| spans[r].0),
            live,
        );
        for a in 0..16 {
            for b in a..17 {
                let shared = group.shared_keys(&(a..b));
                assert!(a <= shared.start && shared.start <= shared.end && shared.end <= b);
                for j in a..b {
                    let all =
                        live == QUERY_GROUP && spans.iter().all(|&(s, e)| (s..e).contains(&j));
                    assert_eq!(
                        shared.contains(&j),
                        all,
                        "{live} queries, {a}..{b}, key {j}"
                    );
                }
            }
        }
    }
}

#[test]
fn every_isa_level_gives_the_same_bits() {
    use super::super::panel::tests::available_isas;
    let mut seed = 37;
    // Weighted values of groups whose queries start and end at different keys, for head
    // sizes with and without a multiple of 8 or 16.
    let spans = [(0, 23), (2, 22), (5, 25), (6, 30)];
    for d in [12, 16, 24, 64, 72, 136] {
        let v: Vec<f32> = (0..30 * d).map(|_| lcg(&mut seed)).collect();
        let probs: Vec<Vec<f32>> = spans
            .iter()
            .map(|&(a, b)| (a..b).map(|_| lcg(&mut seed).abs()).collect())
            .collect();
        for live in 1..=QUERY_GROUP {
            let group = ValueGroup::new(
                std::array::from_fn(|r| if r < live { &probs[r][..] } else { &[] }),
                std::array::from_fn(|r| spans[r].0),
                live,
            );
            let mut want = vec![0f32; live * d];
            for (r, o) in want.chunks_exact_mut(d).enumerate() {
                for (j, &p) in (spans[r].0..spans[r].1).zip(&probs[r]) {
                    for dd in 0..d {
                        o[dd] = p.mul_add(v[j * d + dd], o[dd]);
                    }
                }
            }
            for isa in available_isas() {
                // Whole, and resumed at key 11 and at key 24: the same chains.
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                let mut got = vec![0f32; live * d];
                weighted_values(isa, &group, group.keys.clone(), &v, &mut got);
                assert_eq!(bits(&got), bits(&want), "{isa:?} d {d}, {live} queries");
                let mut parts = vec![0f32; live * d];
                let (a, b) = (group.keys.start, group.keys.end);
                for keys in [a..11.max(a), 11.max(a)..24.min(b), 24.min(b)..b] {
                    weighted_values(isa, &group, keys, &v, &mut parts);
                }
                assert_eq!(bits(&parts), bits(&want), "{isa:?} d {d}, resumed");
            }
        }
    }
    // Whole calls: head sizes with and without a multiple of 8 or 16, windows, GQA, rows
    // of every length in a query group, and rows past a query block.
    for (shape, window) in [
        ((2, 4, 2, 70, 64), None),
        ((1, 3, 1, 37, 72), Some(9)),
        ((1, 2, 2, 45, 12), Some(1)),
        ((1, 2, 1, 130, 24), None),
        ((1, 2, 1, 50, 32), Some(5)),
        ((1, 1, 1, 35, 48), Some(33)),
    ] {
        let (batch, heads, kv_heads, t, head_dim) = shape;
        let s = AttentionShape {
            batch,
            heads,
            kv_heads,
            t,
            head_dim,
        };
        let q: Vec<f32> = (0..s.q_len()).map(|_| lcg(&mut seed) * 3.0).collect();
        let k: Vec<f32> = (0..s.kv_len()).map(|_| lcg(&mut seed) * 3.0).collect();
        let v: Vec<f32> = (0..s.kv_len()).map(|_| lcg(&mut seed)).collect();
        let bits = |isa| -> Vec<u32> {
            causal_attention_with(isa, (&q, &k, &v), s, 0.3, window)
                .iter()
                .map(|x| x.to_bits())
                .collect()
        };
        let want = bits(super::super::Isa::Portable);
        for isa in available_isas() {
            assert!(bits(isa) == want, "{isa:?} {s:?}");
        }
    }
}
