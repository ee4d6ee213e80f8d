//! The loop ferrite's fuzz targets share. cargo-fuzz needs a nightly toolchain this
//! project does not use, so the targets are proptest strategies run in seeded batches:
//! one quick batch with the ordinary tests, or batches for `FERRITE_FUZZ_SECONDS`
//! seconds for a long run (RELIABILITY.md records them). The targets live beside the
//! code they exercise: `crates/engine/tests/fuzz_gguf.rs` (GGUF reader and model
//! loaders) and `crates/server/src/validate/fuzz.rs` (request parser).

use std::time::{Duration, Instant};

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// Runs `check` on inputs from `strategy`: batches of `long_batch` cases for
/// `FERRITE_FUZZ_SECONDS` seconds when that is set, else one batch of `quick` cases.
/// Each batch has its own seed, printed with a failure (a panic in `check`, shrunk to
/// a minimal input) so that it can be replayed. Returns the number of cases run.
pub fn run<S: Strategy>(
    name: &str,
    strategy: S,
    quick: u32,
    long_batch: u32,
    check: impl Fn(S::Value),
) -> u64 {
    let budget = std::env::var("FERRITE_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs);
    let started = Instant::now();
    let (mut cases, mut batch) = (0u64, 0u64);
    loop {
        let config = Config {
            cases: if budget.is_some() { long_batch } else { quick },
            failure_persistence: None,
            ..Config::default()
        };
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&batch.to_le_bytes());
        seed[8..24].copy_from_slice(&started.elapsed().as_nanos().to_le_bytes());
        let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &seed);
        let mut runner = TestRunner::new_with_rng(config.clone(), rng);
        if let Err(e) = runner.run(&strategy, |input| {
            check(input);
            Ok(())
        }) {
            panic!("{name}: batch {batch} (seed {seed:?}) failed: {e}");
        }
        cases += u64::from(config.cases);
        batch += 1;
        if budget.is_none_or(|b| started.elapsed() >= b) {
            break;
        }
    }
    eprintln!(
        "{name}: {cases} cases in {:.1} s, no crash",
        started.elapsed().as_secs_f64()
    );
    cases
}
