//! Attention's tests: each kernel against an exact computation, llama.cpp's choice of kernel
//! per row, sliding windows, and the AVX2 and AVX-512 kernels bit for bit against the
//! portable ones.

use super::*;
use crate::kv_cache::SequenceCache;
use crate::quant::sample::Xorshift;
use AttentionKernel::{Row, Split, Tiled};

/// A one-layer cache holding `keys` and `values` (`kv_width` per position).
fn cache(kv_width: usize, keys: &[f32], values: &[f32]) -> SequenceCache {
    let mut c = SequenceCache::new(1, kv_width, keys.len() / kv_width);
    c.write(0, keys, values);
    c.commit(keys.len() / kv_width);
    c
}

fn input<'a>(
    c: &'a SequenceCache,
    q: &'a [f32],
    kernels: &'a [AttentionKernel],
) -> AttentionInput<'a> {
    AttentionInput {
        q,
        kv: c.layer(0, c.len()),
        n: kernels.len(),
        kernels,
        bidirectional: &[],
    }
}

fn random(rng: &mut Xorshift, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.next_f32() * scale).collect()
}

#[test]
fn attention_to_one_key_returns_its_value() {
    let shape = AttentionShape {
        n_head: 2,
        n_kv_head: 1,
        head_dim: 2,
        scale: 1.0,
        window: None,
        softcap: None,
    };
    let c = cache(2, &[0.5, 0.5], &[2.0, 3.0]);
    for kernel in [Row, Tiled, Split { cells: 512 }] {
        let out = attend(&shape, input(&c, &[1.0, 0.0, 0.0, 1.0], &[kernel]));
        assert_eq!(out, vec![2.0, 3.0, 2.0, 3.0], "{kernel:?}");
    }
}

#[test]
fn sliding_window_hides_old_keys() {
    let shape = AttentionShape {
        n_head: 1,
        n_kv_head: 1,
        head_dim: 1,
        scale: 1.0,
        window: Some(1),
        softcap: None,
    };
    let c = cache(1, &[1.0, 1.0], &[5.0, 7.0]);
    for kernel in [Row, Tiled, Split { cells: 512 }] {
        assert_eq!(attend(&shape, input(&c, &[1.0], &[kernel])), vec![7.0]);
    }
}

#[test]
fn kernels_follow_llama_cpps_choice() {
    assert_eq!(AttentionKernel::for_micro_batch(64, 10), Tiled);
    assert_eq!(AttentionKernel::for_micro_batch(512, 2000), Tiled);
    assert_eq!(AttentionKernel::for_micro_batch(63, 2000), Row);
    assert_eq!(AttentionKernel::for_micro_batch(1, 254), Row);
    // 256 used cells pad to 256, 257 to 512.
    assert_eq!(AttentionKernel::for_micro_batch(1, 255), Row);
    assert_eq!(
        AttentionKernel::for_micro_batch(1, 256),
        Split { cells: 512 }
    );
    assert_eq!(
        AttentionKernel::for_micro_batch(1, 1000),
        Split { cells: 1024 }
    );
}

/// Attention computed in f64 from the f16 keys and values, without any of llama.cpp's
/// roundings.
fn exact(shape: &AttentionShape, c: &SequenceCache, q: &[f32], n: usize) -> Vec<f32> {
    let (hd, group) = (shape.head_dim, shape.n_head / shape.n_kv_head);
    let view = c.layer(0, c.len());
    let mut out = Vec::new();
    for t in 0..n {
        let pos = c.len() - n + t;
        let first = shape.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        for h in 0..shape.n_head {
            let qh = &q[(t * shape.n_head + h) * hd..][..hd];
            let off = h / group * hd;
            let scores: Vec<f64> = (first..=pos)
                .map(|p| {
                    let k = &view.keys(p)[off..off + hd];
                    let dot = qh
                        .iter()
                        .zip(k)
                        .map(|(a, b)| *a as f64 * b.to_f64())
                        .sum::<f64>()
                        * shape.scale as f64;
                    match shape.softcap {
                        Some(cap) => cap as f64 * (dot / cap as f64).tanh(),
                        None => dot,
                    }
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = w.iter().sum();
            for d in 0..hd {
                let v: f64 = (first..=pos)
                    .zip(&w)
                    .map(|(p, w)| w * view.values(p)[off + d].to_f64())
                    .sum();
                out.push((v / total) as f32);
            }
        }
    }
    out
}

#[test]
fn every_kernel_computes_attention() {
    for softcap in [None, Some(3.0)] {
        every_kernel_computes_attention_with(softcap);
    }
}

fn every_kernel_computes_attention_with(softcap: Option<f32>) {
    let shape = AttentionShape {
        n_head: 4,
        n_kv_head: 2,
        head_dim: 64,
        scale: 0.125,
        window: None,
        softcap,
    };
    let mut rng = Xorshift::new(3);
    let positions = 600;
    let width = shape.n_kv_head * shape.head_dim;
    let c = cache(
        width,
        &random(&mut rng, positions * width, 2.0),
        &random(&mut rng, positions * width, 3.0),
    );
    let q = random(&mut rng, 2 * shape.n_head * shape.head_dim, 2.0);
    let want = exact(&shape, &c, &q, 2);
    for kernel in [Row, Tiled, Split { cells: 768 }] {
        let got = attend(&shape, input(&c, &q, &[kernel, kernel]));
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(worst < 2e-2, "{kernel:?}, soft cap {softcap:?}: {worst}");
    }
}

#[test]
fn a_split_whose_second_half_is_empty_is_the_row_kernel() {
    let shape = AttentionShape {
        n_head: 2,
        n_kv_head: 1,
        head_dim: 64,
        scale: 0.125,
        window: None,
        softcap: None,
    };
    let mut rng = Xorshift::new(5);
    let c = cache(
        64,
        &random(&mut rng, 64 * 300, 3.0),
        &random(&mut rng, 64 * 300, 3.0),
    );
    let q = random(&mut rng, 128, 3.0);
    let row = attend(&shape, input(&c, &q, &[Row]));
    let split = attend(&shape, input(&c, &q, &[Split { cells: 1024 }]));
    assert_eq!(row, split);
    // Over both halves the rounding differs.
    let split = attend(&shape, input(&c, &q, &[Split { cells: 512 }]));
    assert_ne!(row, split);
}

/// The SIMD kernels, each with whether this CPU can run it.
fn simd_kernels() -> Vec<(&'static str, Kernels, bool)> {
    #[cfg(target_arch = "x86_64")]
    {
        use super::super::{attention_simd as row, attention_tiled_simd as tiled};
        // What the CPU can run, whatever FERRITE_CPU says.
        let cpu = crate::simd::cpu::detected();
        let avx2 = Kernels {
            row: row::attend_avx2,
            tiled: tiled::attend_avx2,
            tokens_together: false,
        };
        let avx512 = Kernels {
            row: row::attend_avx512,
            tiled: tiled::attend_avx512,
            tokens_together: false,
        };
        vec![("AVX2", avx2, cpu.avx2), ("AVX-512", avx512, cpu.avx512)]
    }
    #[cfg(not(target_arch = "x86_64"))]
    Vec::new()
}

#[test]
fn simd_kernels_are_bit_identical_to_the_portable_ones() {
    for (head_dim, n_head, n_kv_head, window, positions, softcap) in [
        (64, 9, 3, None, 80, None),
        (256, 4, 1, Some(21), 90, None),
        (128, 14, 2, Some(30), 75, Some(50.0)),
        (64, 9, 3, None, 300, Some(20.0)),
        (256, 4, 1, Some(100), 530, None),
        (128, 4, 2, Some(16), 600, Some(50.0)),
    ] {
        let shape = AttentionShape {
            n_head,
            n_kv_head,
            head_dim,
            scale: 0.125,
            window,
            softcap,
        };
        let n = 70;
        let mut rng = Xorshift::new(head_dim as u64 + positions as u64);
        let width = n_kv_head * head_dim;
        // Scores far apart, so that some weights underflow.
        let keys = random(&mut rng, positions * width, 12.0);
        let values = random(&mut rng, positions * width, 6.0);
        let q = random(&mut rng, n * n_head * head_dim, 12.0);
        let c = cache(width, &keys, &values);
        // Every kind of row, in runs of several lengths.
        let kinds = [
            Tiled,
            Row,
            Split { cells: 512 },
            Tiled,
            Split { cells: 768 },
        ];
        let kernels: Vec<AttentionKernel> = (0..n).map(|t| kinds[t * t / 50 % 5]).collect();
        let slow = attend_portable(&shape, input(&c, &q, &kernels));
        for (name, kernels_simd, usable) in simd_kernels() {
            if crate::simd::cpu::lacks(usable, name) {
                continue;
            }
            // SAFETY: the kernels' CPU features are present; head sizes are multiples
            // of 64.
            let fast = unsafe { attend_with(&shape, &[input(&c, &q, &kernels)], kernels_simd) };
            assert!(
                slow.iter()
                    .zip(&fast)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name}, head_dim {head_dim}, {positions} positions"
            );
        }
    }
}

#[test]
fn several_sequences_attend_as_each_alone() {
    let shape = AttentionShape {
        n_head: 2,
        n_kv_head: 1,
        head_dim: 64,
        scale: 0.125,
        window: None,
        softcap: None,
    };
    let mut rng = Xorshift::new(9);
    let mut r = |n: usize| random(&mut rng, n, 1.0);
    let (a, b) = (
        cache(64, &r(64 * 100), &r(64 * 100)),
        cache(64, &r(64 * 3), &r(64 * 3)),
    );
    let (qa, qb) = (r(70 * 128), r(128));
    let ka = vec![Tiled; 70];
    let together = attend_many(&shape, &[input(&a, &qa, &ka), input(&b, &qb, &[Row])]);
    let mut alone = attend(&shape, input(&a, &qa, &ka));
    alone.extend(attend(&shape, input(&b, &qb, &[Row])));
    assert_eq!(together, alone);
}
