//! Every weight format of `fixtures/formats/`, against llama.cpp's own kernels, bit for bit:
//! `ferrite-synth` regenerates the random-weight file each was recorded from, and the
//! products of its matrices (whole, as the loader reads them, and cut to shapes llama.cpp
//! multiplies with another kernel) and its embedding rows must be the very floats
//! `libggml-cpu.so` gave (`fixtures/make_formats.py`; see `fixtures/README.md`).

mod common;

use ferrite_engine::gguf::GgufFile;
use ferrite_engine::quant::{QMatrix, RowKernel};
use ferrite_synth::{write_model, Arch, Spec, WeightType};

/// The recorder's activation: row `t`'s value `k`, a multiple of 1/256 (exact in f32).
fn activation(t: u64, k: u64) -> f32 {
    (((k * 2654435761 + t * 97 + 13) % 2001) as i64 - 1000) as f32 / 256.0
}

/// The first `rows` rows of a row-major matrix of `row_bytes` per row, each cut to its
/// first `bytes` bytes.
fn cut(data: &[u8], row_bytes: usize, rows: usize, bytes: usize) -> Vec<u8> {
    data.chunks_exact(row_bytes)
        .take(rows)
        .flat_map(|row| &row[..bytes])
        .copied()
        .collect()
}

/// Floats of a JSON array.
fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// The first value that differs, if any.
fn first_difference(got: &[f32], want: &[f32]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!("{} values, llama.cpp {}", got.len(), want.len()));
    }
    let i = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits())?;
    Some(format!("value {i}: {}, llama.cpp {}", got[i], want[i]))
}

#[test]
fn every_format_multiplies_and_dequantizes_as_llama_cpp() {
    let files = common::fixture_files("formats");
    assert!(!files.is_empty(), "no fixtures in fixtures/formats");
    let scratch = std::env::temp_dir().join(format!("ferrite-formats-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    let mut failures = Vec::new();
    let mut refused = Vec::new();
    for file in &files {
        let data: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        let ty = WeightType::from_name(data["type"].as_str().unwrap()).unwrap();
        let spec = Spec::small(Arch::from_name(data["arch"].as_str().unwrap()).unwrap(), ty);
        let path = scratch.join(spec.file_name());
        write_model(&spec, &common::model_path("smollm2-135m"), &path).unwrap();
        let mut gguf = GgufFile::open(&path).unwrap();
        for (i, product) in data["products"].as_array().unwrap().iter().enumerate() {
            let name = product["tensor"].as_str().unwrap();
            let [whole_rows, whole_cols] = gguf.dims(name).unwrap()[..] else {
                panic!("{name} is not a matrix")
            };
            let rows = product["rows"].as_u64().unwrap() as usize;
            let cols = product["cols"].as_u64().unwrap() as usize;
            let n = product["activation_rows"].as_u64().unwrap() as usize;
            let matrix = if (rows, cols) == (whole_rows, whole_cols) {
                gguf.matmul(name).unwrap()
            } else {
                let (ggml_type, bytes) = gguf.raw(name).unwrap();
                let row_bytes = bytes.len() / whole_rows;
                let cut = cut(&bytes, row_bytes, rows, row_bytes * cols / whole_cols);
                match QMatrix::from_raw(ggml_type, &cut, rows, cols) {
                    Some(m) => m.unwrap(),
                    // A shape whose kernel ferrite does not follow is refused, never
                    // multiplied otherwise (IQ4_NL's unrepacked matrices: tinyBLAS).
                    None => {
                        assert!(!product["repacked"].as_bool().unwrap(), "{name} refused");
                        refused.push(format!("{}: {rows}x{cols}", ty.name()));
                        continue;
                    }
                }
            };
            let x: Vec<f32> = match product.get("activations") {
                Some(written) => floats(written),
                None => (0..n as u64)
                    .flat_map(|t| (0..cols as u64).map(move |k| activation(t, k)))
                    .collect(),
            };
            // llama.cpp multiplies a micro-batch's rows in groups of four, the rest alone.
            let kernels: Vec<RowKernel> = (0..n)
                .map(|t| match t < n / 4 * 4 {
                    true => RowKernel::Gemm4,
                    false if n > 1 => RowKernel::GemvInBatch,
                    false => RowKernel::Gemv,
                })
                .collect();
            let got = matrix.matmul(&x, &kernels).unwrap();
            if let Some(d) = first_difference(&got, &floats(&product["result"])) {
                failures.push(format!(
                    "{}: product {i} ({name}, {rows}x{cols}): {d}",
                    ty.name()
                ));
            }
        }
        let embedding = &data["embedding"];
        let ids = common::ids(&embedding["ids"]);
        let name = embedding["tensor"].as_str().unwrap();
        let got = gguf.embedding(name).unwrap().rows(&ids).unwrap();
        if let Some(d) = first_difference(&got, &floats(&embedding["rows"])) {
            failures.push(format!("{}: embedding rows: {d}", ty.name()));
        }
        std::fs::remove_file(&path).unwrap();
    }
    std::fs::remove_dir_all(&scratch).ok();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Only IQ4_NL refuses a shape: its three unrepacked products.
    assert_eq!(refused.len(), 3, "{refused:?}");
}
