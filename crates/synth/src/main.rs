//! `ferrite-synth`: writes a seeded random-weight GGUF model (see the library's docs).
//!
//!     ferrite-synth --arch qwen2 --type q4_k [--shape small|1b|8b] [--context N] [--seed N] \
//!         --tokenizer-from smollm2-135m.gguf --out qwen2-q4_k.gguf
//!
//! `--mix llama-quantize` (with `--type q4_k`, `q5_k` or `iq4_xs`) gives each matrix the
//! type `llama-quantize` would (so `q4_k` makes a Q4_K_M file); the default, `uniform`,
//! gives every matrix the one type.
//!
//!     ferrite-synth --projector gemma3 --arch gemma3 [--shape small|1b] [--vision small|full|legacy] \
//!         [--type f16] [--seed N] --out mmproj-gemma3.gguf
//!
//! `--image-tokens idefics3` adds that projector's prompt tokens (`<global-img>`,
//! `<row_1_col_1>`, ...; `qwen2.5vl`: `<|vision_start|>`, `<|vision_end|>`) to the copied
//! vocabulary, for a text model that pairs with it. `--projector` takes `gemma3`,
//! `idefics3` and `qwen2.5vl` (with `--arch qwen2vl`).
//!
//! `--projector` writes the vision projector (an `mmproj` file, llama.cpp's `clip`
//! architecture) that pairs with the text model of that `--arch` and `--shape`: its
//! projection ends in that model's width. `--vision full` is the real model's tower
//! (Gemma 3 4B's SigLIP at 896 pixels), `--vision legacy` the small one without
//! `preproc_image_size` (Idefics3 files from older converters); `--type` is its matrices' type (`f16` by default,
//! as llama.cpp's converter writes them).

use std::path::PathBuf;
use std::process::ExitCode;

use ferrite_synth::{
    write_model, write_projector, Arch, Mix, Projector, ProjectorSpec, Spec, VisionShape,
    WeightType,
};

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("ferrite-synth: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> Result<(), String> {
    let (mut arch, mut ty, mut shape, mut seed) = (None, None, "small".to_string(), 0u64);
    let mut mix = Mix::Uniform;
    let (mut tokenizer, mut out) = (None, None);
    let (mut projector, mut vision) = (None, "small".to_string());
    let mut image_tokens = None;
    let mut context_length = None;
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--arch" => {
                let v = value()?;
                let names: Vec<_> = Arch::ALL.iter().map(|a| a.name()).collect();
                arch = Some(Arch::from_name(&v).ok_or(format!("--arch {v}: one of {names:?}"))?);
            }
            "--type" => {
                let v = value()?;
                let names: Vec<_> = WeightType::ALL.iter().map(|t| t.name()).collect();
                ty =
                    Some(WeightType::from_name(&v).ok_or(format!("--type {v}: one of {names:?}"))?);
            }
            "--mix" => {
                mix = match value()?.as_str() {
                    "uniform" => Mix::Uniform,
                    "llama-quantize" => Mix::LlamaQuantize,
                    other => return Err(format!("--mix {other}: uniform or llama-quantize")),
                }
            }
            "--shape" => shape = value()?,
            "--projector" => {
                let v = value()?;
                let names: Vec<_> = Projector::ALL.iter().map(|p| p.name()).collect();
                projector = Some(
                    Projector::from_name(&v).ok_or(format!("--projector {v}: one of {names:?}"))?,
                );
            }
            "--vision" => vision = value()?,
            "--image-tokens" => {
                let v = value()?;
                let names: Vec<_> = Projector::ALL.iter().map(|p| p.name()).collect();
                image_tokens = Some(
                    Projector::from_name(&v)
                        .ok_or(format!("--image-tokens {v}: one of {names:?}"))?,
                );
            }
            "--context" => {
                let v = value()?;
                context_length = Some(v.parse().map_err(|e| format!("--context {v}: {e}"))?);
            }
            "--seed" => seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--tokenizer-from" => tokenizer = Some(PathBuf::from(value()?)),
            "--out" => out = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown option {other}")),
        }
    }
    let arch = arch.ok_or("--arch is required")?;
    let text_shape = match shape.as_str() {
        "small" => arch.small_shape(),
        "1b" => arch.one_b_shape(),
        "8b" => arch.eight_b_shape(),
        other => return Err(format!("--shape {other}: small, 1b or 8b")),
    };
    if let Some(projector) = projector {
        let shape = match vision.as_str() {
            "small" => projector.small_shape(),
            "full" => projector.full_shape(),
            // A file as older converters wrote it, without `preproc_image_size`.
            "legacy" => VisionShape {
                longest_edge: 0,
                ..projector.small_shape()
            },
            other => return Err(format!("--vision {other}: small, full or legacy")),
        };
        let spec = ProjectorSpec {
            projector,
            shape,
            text_hidden: text_shape.hidden,
            weights: ty.unwrap_or(WeightType::F16),
            seed,
        };
        let out = out.ok_or("--out is required")?;
        return write_projector(&spec, &out).map_err(|e| format!("{}: {e}", out.display()));
    }
    let weights = ty.ok_or("--type is required")?;
    if mix == Mix::LlamaQuantize && !Mix::LLAMA_QUANTIZE_TYPES.contains(&weights) {
        return Err(format!(
            "--mix llama-quantize: no recipe for {}",
            weights.name()
        ));
    }
    let spec = Spec {
        arch,
        weights,
        mix,
        shape: text_shape,
        seed,
        image_tokens,
        context_length,
    };
    let tokenizer = tokenizer.ok_or("--tokenizer-from is required")?;
    let out = out.ok_or("--out is required")?;
    write_model(&spec, &tokenizer, &out).map_err(|e| format!("{}: {e}", out.display()))
}
