//! Decode steps of a real GGUF model, without the server: the forward step alone, on the
//! compute pool as the engine runs it (`with_threads_awake`), for `--streams` sequences
//! that each take one token a step (the rows of a concurrent load's decode step), after a
//! prompt of `--prompt` tokens each (the context attention reads). Prints each round's
//! mean steps per second, and its median, fastest and slowest step.
//!
//! The server adds sampling and HTTP to each step; this isolates the engine's share, so
//! that an A/B of two builds (or of an environment switch) measures only that. Decode
//! of a 1B model is bound by memory bandwidth, which drifts on a shared machine: compare
//! rounds run close together, alternating the builds.
//!
//!     cargo bench -p ferrite-engine --bench decode_step -- --model FILE \
//!         [--prompt 32] [--steps 64] [--rounds 3] [--threads N] [--streams 1]

use std::time::Instant;

use ferrite_engine::kv_cache::SequenceCache;
use ferrite_engine::model::{self, BatchEntry, Logits};
use ferrite_engine::threads;

/// The value of `--name` in `args`, parsed.
fn option<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1)?.parse().ok()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = option::<String>(&args, "--model") else {
        eprintln!(
            "usage: decode_step --model FILE [--prompt 32] [--steps 64] [--rounds 3] [--threads N] \
             [--streams 1]"
        );
        std::process::exit(2);
    };
    let prompt_len: u32 = option(&args, "--prompt").unwrap_or(32).max(1);
    let steps: usize = option(&args, "--steps").unwrap_or(64).max(1);
    let rounds: usize = option(&args, "--rounds").unwrap_or(3);
    let streams: usize = option(&args, "--streams").unwrap_or(1).max(1);
    let pool_threads = option(&args, "--threads").unwrap_or_else(threads::available_cores);
    threads::set_compute_threads(pool_threads).expect("the pool starts once");
    let (_gguf, model) = model::load_path(path.as_ref()).expect("the model loads");
    let vocab = model.info().vocab_size as u64;
    // Arbitrary ids spread over the vocabulary: a step's time does not depend on them.
    let prompt: Vec<u32> = (1..=prompt_len as u64)
        .map(|t| (t * 7919 % vocab) as u32)
        .collect();
    for round in 0..rounds {
        let mut caches: Vec<SequenceCache> = (0..streams)
            .map(|_| model.new_cache(prompt.len() + steps + 1))
            .collect();
        // One step: `tokens[s]` are stream `s`'s new tokens.
        let step = |tokens: &[&[u32]], caches: &mut [SequenceCache]| {
            let mut batch: Vec<BatchEntry> = caches
                .iter_mut()
                .zip(tokens)
                .map(|(cache, tokens)| BatchEntry {
                    tokens,
                    cache,
                    logits: Logits::Last,
                    prompt_len: prompt.len(),
                    images: Vec::new(),
                    grids: Vec::new(),
                })
                .collect();
            threads::with_threads_awake(|| model.forward(&mut batch)).expect("the step runs")
        };
        // The prompts one stream at a time, as their own prefill steps would be.
        for cache in caches.chunks_mut(1) {
            step(&[&prompt], cache);
        }
        let mut tokens: Vec<u32> = (0..streams as u32)
            .map(|s| ((prompt[prompt.len() - 1] + s) as u64 % vocab) as u32)
            .collect();
        let mut times = Vec::with_capacity(steps);
        for _ in 0..steps {
            let start = Instant::now();
            let rows: Vec<&[u32]> = tokens.chunks(1).collect();
            let logits = step(&rows, &mut caches);
            times.push(start.elapsed().as_secs_f64() * 1e3);
            for (token, row) in tokens.iter_mut().zip(&logits) {
                *token = ((*token as u64 * 31 + row.len() as u64 / 3) % vocab) as u32;
            }
        }
        let mean = steps as f64 * 1e3 / times.iter().sum::<f64>();
        times.sort_by(f64::total_cmp);
        println!(
            "round {round}: mean {mean:.1} steps/s; median {:.2} ms, fastest {:.2}, slowest {:.2} \
             (context {}..{})",
            times[steps / 2],
            times[0],
            times[steps - 1],
            prompt.len(),
            prompt.len() + steps
        );
    }
}
