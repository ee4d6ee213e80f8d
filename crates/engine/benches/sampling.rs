//! What picking one token costs over a large vocabulary: greedy (the argmax), temperature
//! with and without top-p, with top-k, the softmax alone and a token's log-probability
//! normaliser, on one row of 262,144 logits (Gemma 3's vocabulary) shaped like a language
//! model's (a broad bell of logits and a few far above it). Milliseconds per row, the
//! median of 31 and the fastest. Compare with the decode step (BENCHMARKS.md): the engine
//! picks every sequence's token between two steps.
//!
//!     cargo bench -p ferrite-engine --bench sampling [-- --vocab 128256]

use std::time::Instant;

use ferrite_engine::quant::sample::Xorshift;
use ferrite_engine::sampling::{
    argmax, candidates, log_sum_exp, softmax_in_place, Sampler, SamplingParams,
};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let vocab = args
        .iter()
        .position(|a| a == "--vocab")
        .and_then(|i| args.get(i + 1))
        .map_or(262_144, |v| v.parse().expect("--vocab N"));
    let mut rng = Xorshift::new(3);
    // A sum of four uniforms: a bell from -8 to 8; then three logits far above it.
    let mut logits: Vec<f32> = (0..vocab)
        .map(|_| {
            let s: f32 = (0..4)
                .map(|_| (rng.next_u64() % 1000) as f32 / 1000.0)
                .sum();
            (s - 2.0) * 4.0
        })
        .collect();
    for (at, value) in [(1234, 25.0), (777, 24.0), (vocab / 3, 23.5)] {
        logits[at % vocab] = value;
    }
    println!("| {vocab} logits | median ms | fastest ms |\n|---|---|---|");
    let time = |name: &str, f: &mut dyn FnMut() -> usize| {
        let mut times = Vec::new();
        let mut keep = 0;
        for _ in 0..31 {
            let started = Instant::now();
            keep ^= f();
            times.push(started.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        println!("| {name} | {:.3} | {:.3} |", times[15], times[0]);
        std::hint::black_box(keep);
    };
    time("greedy (argmax)", &mut || argmax(&logits));
    for (temperature, top_p) in [(1.0f32, 1.0f32), (1.0, 0.9), (0.7, 0.95)] {
        let params = SamplingParams {
            temperature,
            top_p,
            seed: 1,
            ..Default::default()
        };
        let mut sampler = Sampler::new(params, &[]);
        let name = format!("temperature {temperature}, top_p {top_p}");
        time(&name, &mut || sampler.sample(&logits, &[], &[]) as usize);
    }
    let params = SamplingParams {
        temperature: 0.8,
        top_k: Some(40),
        seed: 1,
        ..Default::default()
    };
    let mut sampler = Sampler::new(params, &[]);
    time("temperature 0.8, top_k 40", &mut || {
        sampler.sample(&logits, &[], &[]) as usize
    });
    time("softmax", &mut || {
        let mut c = candidates(&logits);
        softmax_in_place(&mut c);
        c.len()
    });
    time("log-probability normaliser", &mut || {
        log_sum_exp(&logits).to_bits() as usize
    });
}
