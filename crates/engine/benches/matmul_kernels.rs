//! Throughput of the quantized matrix kernels, per weight format and number of activation
//! rows: 1 is single-stream decode (matrix × vector), 4 and 16 batched decode, 128 and 512
//! prompt processing. Random weights and activations; the matrix is 2048 × 1024 (a
//! feed-forward matrix of the served models' size class). Prints giga multiply-adds per
//! second, the fastest of about half a second of runs, on one thread (steadier on a shared
//! machine; `--threads N` for more). `--rows R --cols C` change the matrix (one larger than
//! the last-level cache measures streaming from memory, as decoding a real model does) and
//! `--formats F16,Q4_K` and `--batches 1,4` pick formats and row counts.
//!
//!     cargo bench -p ferrite-engine --bench matmul_kernels [-- --rows 16384 --cols 4096]

use std::time::Instant;

use ferrite_engine::quant::sample::{self, Xorshift};
use ferrite_engine::quant::{OwnFormat, QMatrix, RowKernel};

/// The matrix's default shape.
const ROWS: usize = 2048;
const COLS: usize = 1024;

/// The value of `--name` in `args`, parsed.
fn option<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1)?.parse().ok()
}

/// The fastest of the runs: on a shared machine interference only ever adds time.
fn fastest(v: Vec<f64>) -> f64 {
    v.into_iter().fold(f64::INFINITY, f64::min)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads = option(&args, "--threads").unwrap_or(1);
    let rows = option(&args, "--rows").unwrap_or(ROWS);
    let cols = option(&args, "--cols").unwrap_or(COLS);
    let only: Option<String> = option(&args, "--formats");
    let batches: Option<String> = option(&args, "--batches");
    let batches: Vec<usize> = match batches {
        Some(list) => list
            .split(',')
            .map(|n| n.parse().expect("--batches 1,4"))
            .collect(),
        None => vec![1, 4, 16, 128, 512],
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(|| run(rows, cols, only.as_deref(), &batches));
    println!("\n(giga multiply-adds per second on {threads} thread(s), fastest run)");
}

fn run(rows: usize, cols: usize, only: Option<&str>, batches: &[usize]) {
    let formats = [
        ("Q4_0", OwnFormat::Q4_0),
        // Q4_0 as real models' matrices take it (rows a multiple of eight: llama.cpp's
        // repacked arithmetic).
        ("Q4_0R", OwnFormat::Q4_0_REPACKED),
        ("Q4_1", OwnFormat::Q4_1),
        ("Q5_0", OwnFormat::Q5_0),
        ("Q8_0", OwnFormat::Q8_0),
        ("Q4_K", OwnFormat::Q4_K),
        ("Q5_K", OwnFormat::Q5_K),
        ("Q6_K", OwnFormat::Q6_K),
        ("IQ4_XS", OwnFormat::IQ4_XS),
        ("Q3_K", OwnFormat::Q3_K),
        // Portable kernels only, on every CPU.
        ("Q2_K", OwnFormat::Q2_K_REPACKED),
        ("Q5_1", OwnFormat::Q5_1),
        ("IQ4_NL", OwnFormat::IQ4_NL_REPACKED),
        ("F16", OwnFormat::F16),
        ("BF16", OwnFormat::BF16),
        ("F32", OwnFormat::F32),
    ];
    let mut rng = Xorshift::new(1);
    print!("| format |");
    for &n in batches {
        print!(" {n} row{} |", if n == 1 { "" } else { "s" });
    }
    println!("\n|---|{}", "---|".repeat(batches.len()));
    let picked = |name: &str| only.is_none_or(|only| only.split(',').any(|f| f == name));
    for (name, format) in formats.into_iter().filter(|(name, _)| picked(name)) {
        let data = sample::weights(format, rows, cols, &mut rng);
        let matrix = QMatrix::from_blocks(format, data, rows, cols).unwrap();
        print!("| {name} |");
        for &n in batches {
            let x = sample::activations(n, cols, 2.0, &mut rng);
            // Prompt rows take the kernel llama.cpp's batching would give them.
            let kernel = if n >= RowKernel::WIDE_BATCH {
                RowKernel::Gemm4InWideBatch
            } else if n >= 4 {
                RowKernel::Gemm4
            } else {
                RowKernel::Gemv
            };
            let kernels = vec![kernel; n];
            // Runs for about half a second (at least five), keeping the fastest.
            let mut times = Vec::new();
            let budget = Instant::now();
            while times.len() < 5 || budget.elapsed().as_secs_f64() < 0.5 {
                let started = Instant::now();
                std::hint::black_box(matrix.matmul(&x, &kernels).unwrap());
                times.push(started.elapsed().as_secs_f64());
            }
            let gmacs = (rows * cols * n) as f64 / fastest(times) / 1e9;
            print!(" {gmacs:.1} |");
        }
        println!();
    }
}
