//! Greedy continuations with quantized KV caches (`--cache-type-k/-v` q8_0 and q4_0)
//! against llama-server run with the same cache types: every file of `fixtures/kv-types/`
//! (`fixtures/make_kv_types.py`) replayed greedily, all 16 tokens of every prompt
//! llama.cpp's, with log-probabilities within 1e-3. The files so far are Gemma 3 270M's and
//! a random-weight `gemma3` file's, recorded on an AVX2 host: with a quantized cache
//! llama.cpp computes them as its AVX-512 build does. The SiLU models' files need an
//! AVX-512 host (fixtures/README.md).

mod common;

use std::path::Path;

use ferrite_engine::kv_cache::{KvType, KvTypes};
use ferrite_engine::model::{self, Model};
use ferrite_synth::{write_model, Arch, Spec, WeightType};

const LOGPROB_TOLERANCE: f32 = 1e-3;

/// The model a fixture was recorded on: a pulled one, or ferrite-synth's file regenerated.
fn load(data: &serde_json::Value, scratch: &Path) -> Box<dyn Model> {
    let synth = &data["synth"];
    if synth.is_null() {
        let name = data["model"].as_str().unwrap();
        return model::load_path(&common::model_path(name)).unwrap().1;
    }
    let arch = Arch::from_name(synth["arch"].as_str().unwrap()).unwrap();
    let ty = WeightType::from_name(synth["type"].as_str().unwrap()).unwrap();
    let spec = Spec::small(arch, ty);
    let path = scratch.join(spec.file_name());
    write_model(&spec, &common::model_path("smollm2-135m"), &path).unwrap();
    let loaded = model::load_path(&path);
    std::fs::remove_file(&path).unwrap();
    loaded.unwrap().1
}

/// Replays one fixture with its cache types; the first disagreement, if any.
fn check(data: &serde_json::Value, scratch: &Path) -> Result<String, String> {
    let mut model = load(data, scratch);
    let kind = |key: &str| KvType::parse(data[key].as_str().unwrap()).unwrap();
    let types = KvTypes {
        keys: kind("cache_type_k"),
        values: kind("cache_type_v"),
    };
    assert!(!types.is_f16());
    model.set_kv_types(types).map_err(|e| e.to_string())?;
    model.set_context_length(4096);
    let mut worst = 0f32;
    for (c, case) in data["cases"].as_array().unwrap().iter().enumerate() {
        let prompt = common::ids(&case["prompt_ids"]);
        let steps = case["steps"].as_array().unwrap();
        assert_eq!(steps.len(), 16);
        let diff = common::replay_greedy(model.as_ref(), &prompt, steps)
            .and_then(|r| r.check(LOGPROB_TOLERANCE))
            .map_err(|e| format!("prompt {c}, {e}"))?;
        worst = worst.max(diff);
    }
    Ok(format!("worst logprob diff {worst:.1e}"))
}

#[test]
fn quantized_caches_match_llama_cpp_with_the_same_cache_types() {
    let scratch = std::env::temp_dir().join(format!("ferrite-kv-types-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let files = common::fixture_files("kv-types");
    // Gemma 3 270M and a synthetic gemma3 file, each with q8_0 and q4_0 caches.
    assert!(
        files.len() >= 4,
        "{} files in fixtures/kv-types",
        files.len()
    );
    let mut failures = Vec::new();
    for file in &files {
        let data: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        let name = file.file_stem().unwrap().to_string_lossy().into_owned();
        match check(&data, &scratch) {
            Ok(summary) => eprintln!("{name}: ok, {summary}"),
            Err(e) => {
                eprintln!("{name}: {e}");
                failures.push(name);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    assert!(failures.is_empty(), "not llama.cpp's answers: {failures:?}");
}

/// A quantized cache needs heads of whole 32-value blocks, as llama.cpp does: a model
/// whose heads hold 48 values refuses one (naming the head size), and keeps f16.
#[test]
fn a_quantized_cache_is_refused_for_heads_that_are_not_whole_blocks() {
    let spec = Spec {
        shape: ferrite_synth::Shape {
            hidden: 192,
            layers: 1,
            heads: 4,
            kv_heads: 2,
            head_dim: 48,
            ffn: 256,
        },
        ..Spec::small(Arch::Llama, WeightType::F32)
    };
    let path = std::env::temp_dir().join(format!("ferrite-kv-head48-{}.gguf", std::process::id()));
    write_model(&spec, &common::model_path("smollm2-135m"), &path).unwrap();
    let loaded = model::load_path(&path);
    std::fs::remove_file(&path).unwrap();
    let mut model = loaded.unwrap().1;
    for t in [KvType::Q8_0, KvType::Q4_0] {
        let err = model
            .set_kv_types(KvTypes {
                keys: KvType::F16,
                values: t,
            })
            .unwrap_err()
            .to_string();
        assert!(err.contains("48 values") && err.contains(t.name()), "{err}");
    }
    assert_eq!(model.kv_types(), KvTypes::F16);
    model.set_kv_types(KvTypes::F16).unwrap();
}
