//! libFuzzer target: any bytes as a constraint (the first byte picks regex, JSON schema
//! or Lark; the rest is its source), compiled against SmolLM2's real vocabulary, then a
//! few mask/consume steps. A panic, a crash, or an input whose compile plus steps take
//! longer than [`wall_limit`] is a finding: grammar work must be bounded whatever the
//! client sends. Seeds: `corpus/constraint/`.
//!
//!     ferrite pull smollm2-135m
//!     cargo fuzz run --fuzz-dir libfuzzer --sanitizer none constraint WORK_DIR libfuzzer/corpus/constraint -- -max_total_time=600 -timeout=10

#![no_main]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ferrite_engine::constrain::{regexes, ConstraintFactory, Grammar, GrammarKind};
use ferrite_engine::gguf::GgufFile;
use ferrite_engine::tokenizer::Tokenizer;

/// Longest one input may take, compile and every step together: 3 s in the optimized build
/// (`cargo fuzz run`'s default), or `FERRITE_FUZZ_WALL_LIMIT_SECS`. The suite's smoke run
/// (`scripts/fuzz_smoke.sh`) builds unoptimized, where the same work takes 10-20 times
/// longer, and sets it higher.
fn wall_limit() -> Duration {
    *WALL_LIMIT.get().expect("read at start-up")
}

/// [`wall_limit`], read once before the first input (`init` below): a bad setting ends
/// the run there, not as a finding saved with an input.
static WALL_LIMIT: OnceLock<Duration> = OnceLock::new();

fn read_wall_limit() -> Duration {
    let Ok(set) = std::env::var("FERRITE_FUZZ_WALL_LIMIT_SECS") else {
        return Duration::from_secs(3);
    };
    match set.parse::<f64>().ok().and_then(|s| Duration::try_from_secs_f64(s).ok()) {
        Some(limit) => limit,
        None => {
            eprintln!("FERRITE_FUZZ_WALL_LIMIT_SECS={set:?}: expected seconds");
            std::process::exit(2)
        }
    }
}

/// Mask/consume steps run on a grammar that compiles.
const STEPS: usize = 8;

fn factory() -> &'static (ConstraintFactory, usize) {
    static FACTORY: OnceLock<(ConstraintFactory, usize)> = OnceLock::new();
    FACTORY.get_or_init(|| {
        let home = std::env::var_os("FERRITE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/ferrite"));
        let path = home.join("models/smollm2-135m.gguf");
        let gguf = GgufFile::open(&path).expect("run `ferrite pull smollm2-135m` first");
        let tokenizer = Arc::new(Tokenizer::from_gguf(&gguf.meta).expect("a tokenizer"));
        let vocab = tokenizer.vocab_size();
        (
            ConstraintFactory::new(tokenizer, regexes::DEFAULT_MAX_REGEX_MATCH_BYTES)
                .expect("a grammar factory"),
            vocab,
        )
    })
}

libfuzzer_sys::fuzz_target!(init: {
    WALL_LIMIT.get_or_init(read_wall_limit);
}, |data: &[u8]| {
    let Some((&selector, source)) = data.split_first() else {
        return;
    };
    let kind = match selector % 3 {
        0 => GrammarKind::Regex,
        1 => GrammarKind::JsonSchema,
        _ => GrammarKind::Lark,
    };
    let grammar = Grammar {
        kind,
        source: String::from_utf8_lossy(source).into_owned(),
    };
    let (factory, vocab) = factory();
    let started = Instant::now();
    if let Ok(mut constraint) = factory.compile(&grammar) {
        let mut logits = vec![0.0f32; *vocab];
        for step in 0..STEPS {
            if constraint.mask(&mut logits).is_err() || constraint.is_complete() {
                break;
            }
            // A token the grammar allows, chosen by the input so runs differ.
            let allowed: Vec<usize> = (0..logits.len()).filter(|&i| logits[i] == 0.0).collect();
            let Some(&token) = allowed.get((selector as usize + step * 31) % allowed.len().max(1)) else {
                break;
            };
            if constraint.consume(token as u32).is_err() {
                break;
            }
            if step == 0 {
                // As a sequence does: once per forced run, not at every token.
                let _ = constraint.forced_tokens();
            }
            logits.fill(0.0);
        }
    }
    let (elapsed, limit) = (started.elapsed(), wall_limit());
    assert!(
        elapsed < limit,
        "grammar work took {elapsed:?} (limit {limit:?}) for {kind:?} {:?}",
        grammar.source
    );
});
