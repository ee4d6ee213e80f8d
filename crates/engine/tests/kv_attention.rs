//! Attention over quantized KV caches against llama.cpp's, bit for bit: the rotation, the
//! quantized writes, the scores against Q8_0 queries, the f32 (or f16) value sums and the
//! rotation back, on the inputs `fixtures/kv_attention.cpp` generated for each case of
//! `fixtures/kv_attention.llamacpp.json` (see fixtures/README.md).

mod common;

use base64::Engine as _;
use ferrite_engine::kv_cache::{KvType, KvTypes, SequenceCache};
use ferrite_engine::model::attention::{attend, AttentionInput, AttentionKernel, AttentionShape};
use ferrite_engine::model::hadamard::{rotate, Rotation};

/// splitmix64, as `kv_attention.cpp` draws its inputs.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in -1..1 with 24 significant bits.
    fn value(&mut self) -> f32 {
        (self.next() >> 40) as f32 / 8_388_608.0 - 1.0
    }

    fn values(&mut self, n: usize, times: f32) -> Vec<f32> {
        (0..n).map(|_| times * self.value()).collect()
    }
}

fn int(case: &serde_json::Value, key: &str) -> usize {
    case[key].as_u64().unwrap_or_else(|| panic!("{key}")) as usize
}

/// ferrite's outputs for one case, as llama.cpp's graph computes them.
fn ferrite_outputs(case: &serde_json::Value) -> Vec<f32> {
    let kind = |key: &str| KvType::parse(case[key].as_str().unwrap()).unwrap();
    let types = KvTypes {
        keys: kind("type_k"),
        values: kind("type_v"),
    };
    let (d, h, hkv) = (
        int(case, "head_dim"),
        int(case, "n_head"),
        int(case, "n_kv_head"),
    );
    let (cells, rows) = (int(case, "cells"), int(case, "query_rows"));
    let mut rng = SplitMix(case["seed"].as_u64().unwrap());
    let mut q = rng.values(rows * h * d, 1.0);
    let mut k = rng.values(cells * hkv * d, 2.0);
    let mut v = rng.values(cells * hkv * d, 1.0);
    let rotation = Rotation::for_cache(types, d);
    if let Some(n) = rotation.keys {
        rotate(&mut q, n);
        rotate(&mut k, n);
    }
    if let Some(n) = rotation.values {
        rotate(&mut v, n);
    }
    let mut cache = SequenceCache::with_types(1, hkv * d, cells, types);
    cache.write(0, &k, &v);
    cache.commit(cells);
    let cap = case["softcap"].as_f64().unwrap() as f32;
    let shape = AttentionShape {
        n_head: h,
        n_kv_head: hkv,
        head_dim: d,
        scale: 1.0 / (d as f32).sqrt(),
        window: None,
        softcap: (cap != 0.0).then_some(cap),
    };
    // The kernels an f16 cache would take for these rows: a quantized cache must not.
    let kernels: Vec<AttentionKernel> = (cells - rows..cells)
        .map(|pos| AttentionKernel::for_micro_batch(rows, pos))
        .collect();
    let mut out = attend(
        &shape,
        AttentionInput {
            q: &q,
            kv: cache.layer(0, cells),
            n: rows,
            kernels: &kernels,
            bidirectional: &[],
        },
    );
    if let Some(n) = rotation.values {
        rotate(&mut out, n);
    }
    out
}

#[test]
fn quantized_cache_attention_matches_llama_cpp_bit_for_bit() {
    let fixture = common::fixture("kv_attention.llamacpp.json");
    let cases = fixture["cases"].as_array().unwrap();
    assert!(cases.len() >= 8);
    let mut failures = Vec::new();
    for case in cases {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(case["output_f32_base64"].as_str().unwrap())
            .unwrap();
        let expected: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let got = ferrite_outputs(case);
        assert_eq!(got.len(), expected.len());
        let differ = got
            .iter()
            .zip(&expected)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        let worst = got
            .iter()
            .zip(&expected)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let what = case["what"].as_str().unwrap();
        eprintln!(
            "{what}: {differ} of {} outputs differ (worst {worst:e})",
            got.len()
        );
        if differ > 0 {
            failures.push(what.to_string());
        }
    }
    assert!(failures.is_empty(), "not llama.cpp's bits: {failures:?}");
}
