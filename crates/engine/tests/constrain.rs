//! Structured output on a real model: every sampled sequence follows its grammar, a bad
//! grammar is an error before generation, forced tokens are verified as drafts.

mod common;

use ferrite_engine::constrain::{Grammar, GrammarKind};
use ferrite_engine::sampling::SamplingParams;
use ferrite_engine::{Engine, EngineHandle, FinishReason, SequenceEvent, SequenceRequest};

fn start() -> Engine {
    common::start_engine("smollm2-135m", common::config())
}

/// Generates with `grammar` at temperature 1 and returns the text and why it ended.
fn generate(
    h: &EngineHandle,
    prompt: &str,
    grammar: &Grammar,
    seed: u64,
) -> (String, FinishReason) {
    let mut r = SequenceRequest::new(
        h.tokenizer().encode_prompt(prompt),
        SamplingParams {
            temperature: 1.0,
            seed,
            ..Default::default()
        },
        96,
    );
    r.constraint = Some(h.compile_grammar(grammar).unwrap());
    let mut rx = h.submit(r).unwrap();
    let mut text = String::new();
    while let Some(event) = rx.blocking_recv() {
        match event {
            SequenceEvent::Token { text: t, .. } => text.push_str(&t),
            SequenceEvent::Finished { reason, .. } => return (text, reason),
            other => panic!("unexpected {other:?}"),
        }
    }
    panic!("no finish");
}

fn grammar(kind: GrammarKind, source: &str) -> Grammar {
    Grammar {
        kind,
        source: source.into(),
    }
}

#[test]
fn constrained_generation_on_smollm2() {
    let engine = start();
    let h = engine.handle();

    let date_regex = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]";
    let full_match = regex::Regex::new(&format!("^(?:{date_regex})$")).unwrap();
    let date = grammar(GrammarKind::Regex, date_regex);
    for seed in 0..5 {
        let (text, reason) = generate(&h, "The date today is", &date, seed);
        assert!(
            full_match.is_match(&text),
            "{text:?} does not match the regex"
        );
        assert!(
            matches!(
                reason,
                FinishReason::GrammarComplete | FinishReason::EndOfSequence(_)
            ),
            "{reason:?}"
        );
    }

    let choice = grammar(GrammarKind::Regex, "(red)|(green)|(blue)");
    for seed in 0..5 {
        let (text, _) = generate(&h, "My favourite colour is", &choice, seed);
        assert!(
            ["red", "green", "blue"].contains(&text.as_str()),
            "{text:?}"
        );
    }

    // Long constant keys are forced: they go through as drafts, several per step.
    let schema = grammar(
        GrammarKind::JsonSchema,
        r#"{"type":"object","properties":{"temperature_in_celsius":{"type":"integer"},"description_of_the_weather":{"enum":["sunny","rainy"]}},"required":["temperature_in_celsius","description_of_the_weather"],"additionalProperties":false}"#,
    );
    let accepted = h.stats().draft_tokens_accepted;
    for seed in 0..3 {
        let (text, reason) = generate(&h, "Weather report as JSON:", &schema, seed);
        let prefix = r#"{"temperature_in_celsius":"#;
        let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        assert!(compact.starts_with(prefix), "{text:?}");
        assert!(
            compact.ends_with(r#""description_of_the_weather":"sunny"}"#)
                || compact.ends_with(r#""description_of_the_weather":"rainy"}"#),
            "{text:?} ({reason:?})"
        );
    }
    assert!(
        h.stats().draft_tokens_accepted > accepted,
        "forced tokens were drafted"
    );

    // Each refusal says what is wrong, in the compiler's words.
    for (kind, bad, says) in [
        (GrammarKind::Regex, "(unclosed", "unclosed group"),
        (GrammarKind::JsonSchema, "{not json", "key must be a string"),
        (
            GrammarKind::JsonSchema,
            r#"{"type":"no-such-type"}"#,
            "no-such-type",
        ),
        (GrammarKind::Lark, "start: undefined_rule", "undefined_rule"),
    ] {
        let err = h.compile_grammar(&grammar(kind, bad)).unwrap_err();
        assert!(
            err.to_lowercase().contains(says),
            "{kind:?} {bad}: {err:?} does not mention {says:?}"
        );
    }
    engine.shutdown();
}

/// The regex bound is the engine's setting: a lower one refuses what the default allows.
#[test]
fn the_regex_bound_follows_the_configuration() {
    let engine = common::start_engine(
        "smollm2-135m",
        ferrite_engine::EngineConfig {
            max_regex_match_bytes: 1000,
            ..common::config()
        },
    );
    let h = engine.handle();
    let err = h
        .compile_grammar(&grammar(GrammarKind::Regex, "a{1001}"))
        .unwrap_err();
    assert!(err.contains("at most 1000"), "{err}");
    assert!(h
        .compile_grammar(&grammar(GrammarKind::Regex, "a{1000}"))
        .is_ok());
    engine.shutdown();
}

/// Grammars that cost too much or can match nothing never stall the engine: the
/// unsatisfiable ones are refused when compiled, the expensive ones are bounded per token,
/// and another sequence keeps running beside them.
#[test]
fn pathological_grammars_are_bounded() {
    let engine = start();
    let h = engine.handle();
    for (kind, source) in [
        (GrammarKind::JsonSchema, r##"{"$ref":"#"}"##),
        (
            GrammarKind::JsonSchema,
            r##"{"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}"##,
        ),
        (GrammarKind::Regex, r"[^\s\S]"),
        (GrammarKind::Lark, "start: x\nx: x \"a\""),
    ] {
        let err = h.compile_grammar(&grammar(kind, source)).unwrap_err();
        assert!(err.contains("no output"), "{source}: {err}");
    }
    // A regex whose every match is longer than 16 KiB is refused: compiling one walks
    // every byte it forces.
    for source in ["a{100000}", "(a{1000}){1000}", "\u{FFFD}{101695}"] {
        let err = h
            .compile_grammar(&grammar(GrammarKind::Regex, source))
            .unwrap_err();
        assert!(err.contains("at least"), "{source}: {err}");
    }
    for source in ["a{10000}", "(a{100}){100}", "a{16384}"] {
        let started = std::time::Instant::now();
        let (text, reason) = generate(&h, "x", &grammar(GrammarKind::Regex, source), 1);
        assert!(
            started.elapsed().as_secs_f64() < 10.0,
            "{source}: {:?}",
            started.elapsed()
        );
        assert!(text.chars().all(|c| c == 'a'), "{source}: {text:?}");
        // Either it ran to max_tokens (96) or its grammar went over the limits.
        assert!(
            matches!(reason, FinishReason::Length | FinishReason::GrammarLimit(_)),
            "{source}: {reason:?}"
        );
    }
    engine.shutdown();
}
