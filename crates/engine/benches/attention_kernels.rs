//! Speed of attention against a sequence's paged f16 KV cache, per model shape and context
//! length: a decode step (one query row, llama.cpp's row or split kernel) and a prompt's
//! micro-batch of 64 rows (the tiled kernel). The cache holds every layer of the model, as
//! in serving, and each measurement attends once per layer in turn, so the keys and values
//! come from memory as they do in a decode step. Prints microseconds per layer and
//! nanoseconds per (query head, key) pair, the fastest of about half a second of runs,
//! on the compute threads (`--threads N`, default 2). With `--kv-type q8_0` (or `q4_0`) the
//! cache holds keys and values in that type, and every row takes the quantized row kernel
//! (llama.cpp's `-ctk`/`-ctv`); `--shapes 1` picks shapes by their number in the table.
//!
//!     cargo bench -p ferrite-engine --bench attention_kernels [-- --contexts 512,4096]

use std::time::Instant;

use ferrite_engine::kv_cache::{KvType, KvTypes, SequenceCache};
use ferrite_engine::model::attention::{attend, AttentionInput, AttentionKernel, AttentionShape};
use ferrite_engine::quant::sample::Xorshift;

/// The value of `--name` in `args`, parsed.
fn option<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1)?.parse().ok()
}

/// A model's attention: name, layers, query heads, KV heads, head size.
const SHAPES: [(&str, usize, usize, usize, usize); 3] = [
    ("SmolLM2-135M", 30, 9, 3, 64),
    ("Llama-3.2-1B", 16, 32, 8, 64),
    ("Gemma 3 270M", 18, 4, 1, 256),
];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads = option(&args, "--threads").unwrap_or(2);
    let contexts: Vec<usize> = option::<String>(&args, "--contexts")
        .unwrap_or_else(|| "512,4096".into())
        .split(',')
        .map(|n| n.parse().expect("--contexts 512,4096"))
        .collect();
    let kv_type = option::<String>(&args, "--kv-type").map_or(KvType::F16, |name| {
        KvType::parse(&name).expect("--kv-type f16, q8_0 or q4_0")
    });
    let shapes: Vec<usize> = option::<String>(&args, "--shapes").map_or_else(
        || (0..SHAPES.len()).collect(),
        |s| {
            s.split(',')
                .map(|n| n.parse().expect("--shapes 0,1"))
                .collect()
        },
    );
    let types = KvTypes {
        keys: kv_type,
        values: kv_type,
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap()
        .install(|| run(&contexts, &shapes, types));
    println!("\n(per layer, the fastest run; {threads} thread(s); {kv_type} keys and values)");
}

fn run(contexts: &[usize], shapes: &[usize], types: KvTypes) {
    println!("| model | context | decode µs/layer | ns per head·key | 64-row batch µs/layer | ns per head·key |");
    println!("|---|---|---|---|---|---|");
    let mut rng = Xorshift::new(1);
    for &(name, layers, n_head, n_kv_head, head_dim) in shapes.iter().map(|&i| &SHAPES[i]) {
        let shape = AttentionShape {
            n_head,
            n_kv_head,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: None,
            softcap: None,
        };
        for &context in contexts {
            let width = n_kv_head * head_dim;
            let mut cache = SequenceCache::with_types(layers, width, context, types);
            let kv: Vec<f32> = (0..context * width).map(|_| rng.next_f32()).collect();
            for layer in 0..layers {
                cache.write(layer, &kv, &kv);
            }
            cache.commit(context);
            let q: Vec<f32> = (0..64 * n_head * head_dim)
                .map(|_| rng.next_f32())
                .collect();
            // The last row alone, as a decode step; the last 64 rows as a prompt's tile.
            let decode = [AttentionKernel::for_micro_batch(1, context - 1)];
            let tiled: Vec<AttentionKernel> = (context - 64..context)
                .map(|pos| AttentionKernel::for_micro_batch(64, pos))
                .collect();
            let cell = |kernels: &[AttentionKernel]| {
                let rows = kernels.len();
                let per_layer = fastest(|| {
                    for layer in 0..layers {
                        let input = AttentionInput {
                            q: &q[..rows * n_head * head_dim],
                            kv: cache.layer(layer, context),
                            n: rows,
                            kernels,
                            bidirectional: &[],
                        };
                        std::hint::black_box(attend(&shape, input));
                    }
                }) / layers as f64;
                let pairs = (n_head * rows * context) as f64;
                (per_layer * 1e6, per_layer * 1e9 / pairs)
            };
            let (d_us, d_ns) = cell(&decode);
            let (t_us, t_ns) = cell(&tiled);
            println!("| {name} | {context} | {d_us:.1} | {d_ns:.2} | {t_us:.1} | {t_ns:.2} |");
        }
    }
}

/// Seconds of the fastest of the runs of `f` over about half a second.
fn fastest(mut f: impl FnMut()) -> f64 {
    let started = Instant::now();
    let mut best = f64::INFINITY;
    while started.elapsed().as_secs_f64() < 0.5 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}
