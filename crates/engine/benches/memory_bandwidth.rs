//! The machine's memory bandwidth, STREAM-style, so that decode speed can be stated as a
//! fraction of it: a read of one array (a sum, which is what a matrix-vector product
//! does with its weights) and the triad `a = b + s·c`, over arrays far larger than the
//! last-level cache, on the compute threads (`--threads N`, default 2), each thread on its
//! own contiguous part. Prints GB/s (10⁹ bytes), the best of `--rounds` (default 5), and
//! with `--json` one JSON object instead.
//!
//!     cargo bench -p ferrite-engine --bench memory_bandwidth [-- --threads 2 --json]

use std::time::Instant;

use rayon::prelude::*;

/// Floats per array: 256 MiB read by the sum, 3 × 256 MiB moved by the triad.
const LEN: usize = 64 << 20;

/// The value of `--name` in `args`, parsed.
fn option<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1)?.parse().ok()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads = option(&args, "--threads").unwrap_or(2);
    let rounds = option(&args, "--rounds").unwrap_or(5usize).max(1);
    let json = args.iter().any(|a| a == "--json");
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    let (read, triad) = pool.install(|| measure(threads, rounds));
    if json {
        println!(
            "{{\"threads\": {threads}, \"read_gb_s\": {read:.2}, \"triad_gb_s\": {triad:.2}}}"
        );
    } else {
        println!(
            "read {read:.1} GB/s, triad {triad:.1} GB/s ({threads} threads, best of {rounds})"
        );
    }
}

/// Best read and triad bandwidths in GB/s.
fn measure(threads: usize, rounds: usize) -> (f64, f64) {
    // Filled in parallel, so that each thread's pages are where it first touched them.
    let fill = |v: f32| {
        let mut a = vec![0f32; LEN];
        a.par_chunks_mut(LEN / threads).for_each(|c| c.fill(v));
        a
    };
    let (mut a, b, c) = (fill(0.0), fill(1.0), fill(2.0));
    let part = LEN / threads;
    let mut best = (0f64, 0f64);
    for _ in 0..rounds {
        let t = Instant::now();
        let sum: f32 = b.par_chunks(part).map(sum_lanes).sum();
        let read = (LEN * 4) as f64 / t.elapsed().as_secs_f64() / 1e9;
        std::hint::black_box(sum);
        let t = Instant::now();
        a.par_chunks_mut(part)
            .zip(b.par_chunks(part))
            .zip(c.par_chunks(part))
            .for_each(|((a, b), c)| {
                for ((a, b), c) in a.iter_mut().zip(b).zip(c) {
                    *a = b + 3.0 * c;
                }
            });
        let triad = (3 * LEN * 4) as f64 / t.elapsed().as_secs_f64() / 1e9;
        std::hint::black_box(&a);
        best = (best.0.max(read), best.1.max(triad));
    }
    best
}

/// A sum in sixteen independent lanes, so that the loop is bound by the loads, not by
/// one addition's latency.
fn sum_lanes(x: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    for chunk in x.chunks_exact(16) {
        for (l, v) in lanes.iter_mut().zip(chunk) {
            *l += v;
        }
    }
    lanes.iter().sum()
}
