//! The machine's memory bandwidth, STREAM-style, so that decode speed can be stated as a
//! fraction of it: a read of one array (a sum, which is what a matrix-vector product
//! does with its weights) and the triad `a = b + s·c`, over arrays far larger than the
//! last-level cache, on the compute threads (`--threads N`, default 2), each thread on its
//! own contiguous part. The read is measured twice: one sequential stream per thread, and
//! four streams per thread read side by side (the four quarters of its part, a chunk of
//! each in turn), which keeps more lines in flight than one stream's hardware prefetch
//! does, as a matrix product reading several weight rows at once can. The larger of the
//! two is the read ceiling a decode's weight streaming is compared with. Prints GB/s (10⁹
//! bytes), the best of `--rounds` (default 5), and with `--json` one JSON object instead.
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
    let Best {
        read,
        read_streams,
        triad,
    } = pool.install(|| measure(threads, rounds));
    if json {
        println!(
            "{{\"threads\": {threads}, \"read_gb_s\": {read:.2}, \
             \"read_{STREAMS}_streams_gb_s\": {read_streams:.2}, \"triad_gb_s\": {triad:.2}}}"
        );
    } else {
        println!(
            "read {read:.1} GB/s, read in {STREAMS} streams per thread {read_streams:.1} GB/s, \
             triad {triad:.1} GB/s ({threads} threads, best of {rounds})"
        );
    }
}

/// Streams per thread in the second read.
const STREAMS: usize = 4;

/// The best bandwidths of the rounds, GB/s.
#[derive(Default)]
struct Best {
    /// One stream per thread.
    read: f64,
    /// [`STREAMS`] streams per thread.
    read_streams: f64,
    /// The triad (three arrays' bytes per element).
    triad: f64,
}

/// The best bandwidths of `rounds` rounds on `threads` threads.
fn measure(threads: usize, rounds: usize) -> Best {
    // Filled in parallel, so that each thread's pages are where it first touched them.
    let fill = |v: f32| {
        let mut a = vec![0f32; LEN];
        a.par_chunks_mut(LEN / threads).for_each(|c| c.fill(v));
        a
    };
    let (mut a, b, c) = (fill(0.0), fill(1.0), fill(2.0));
    let part = LEN / threads;
    let mut best = Best::default();
    let gb_s = |bytes: usize, t: Instant| bytes as f64 / t.elapsed().as_secs_f64() / 1e9;
    for _ in 0..rounds {
        let t = Instant::now();
        let sum: f32 = b.par_chunks(part).map(sum_lanes).sum();
        let read = gb_s(LEN * 4, t);
        std::hint::black_box(sum);
        let t = Instant::now();
        let sum: f32 = c.par_chunks(part).map(sum_streams).sum();
        let read_streams = gb_s(LEN * 4, t);
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
        let triad = gb_s(3 * LEN * 4, t);
        std::hint::black_box(&a);
        best = Best {
            read: best.read.max(read),
            read_streams: best.read_streams.max(read_streams),
            triad: best.triad.max(triad),
        };
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

/// [`sum_lanes`] over the [`STREAMS`] quarters of `x` side by side: a 64-byte chunk of
/// each in turn, each quarter into its own lanes.
fn sum_streams(x: &[f32]) -> f32 {
    let quarter = x.len() / STREAMS;
    let parts: [&[f32]; STREAMS] = std::array::from_fn(|s| &x[s * quarter..][..quarter]);
    let mut lanes = [[0f32; 16]; STREAMS];
    for i in (0..quarter - quarter % 16).step_by(16) {
        for (lanes, part) in lanes.iter_mut().zip(&parts) {
            for (l, v) in lanes.iter_mut().zip(&part[i..i + 16]) {
                *l += v;
            }
        }
    }
    lanes.iter().flatten().sum()
}
