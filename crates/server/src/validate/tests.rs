//! Validation of whole request bodies: each field's rule and the 400 that names it.

use super::*;

fn parse(body: &str) -> Result<GenerateParams, ApiError> {
    GenerateParams::new(parse_body(body.as_bytes(), false)?, &FieldLimits::DEFAULT)
}

/// The field a 400 names.
pub(super) fn param_of(e: ApiError) -> Option<String> {
    match e {
        ApiError::InvalidRequest { param, .. } => param,
        _ => None,
    }
}

fn with(extra: &str) -> String {
    format!(r#"{{"model":"m","prompt":"x",{extra}}}"#)
}

#[test]
fn defaults_resolve() {
    let p = parse(r#"{"model":"m","prompt":"hi"}"#).unwrap();
    assert_eq!((p.n, p.best_of), (1, 1));
    assert_eq!(p.sampling.temperature, 1.0);
    assert_eq!(p.sampling.repetition_penalty, 1.0);
    assert_eq!(p.max_tokens, None);
    assert_eq!(p.overflow, Overflow::Truncate);
    assert!(p.output.skip_special_tokens && !p.output.echo);
    assert_eq!(p.output.logprobs, None);
    assert_eq!(p.prompts, vec![PromptInput::Text("hi".into())]);
}

#[test]
fn all_prompt_shapes_parse() {
    assert_eq!(
        parse(r#"{"model":"m","prompt":["a","b"]}"#)
            .unwrap()
            .prompts
            .len(),
        2
    );
    assert_eq!(
        parse(r#"{"model":"m","prompt":[1,2]}"#).unwrap().prompts,
        vec![PromptInput::Tokens(vec![1, 2])]
    );
    assert_eq!(
        parse(r#"{"model":"m","prompt":[[1],[2,3]]}"#)
            .unwrap()
            .prompts
            .len(),
        2
    );
}

/// Every field gives a 400 naming itself for a wrong type or a value out of range.
#[test]
fn errors_name_their_field() {
    let cases = [
        (r#""temperature":5"#, "temperature"),
        (r#""temperature":"hot""#, "temperature"),
        (r#""top_p":0"#, "top_p"),
        (r#""top_k":-2"#, "top_k"),
        (r#""top_k":1.5"#, "top_k"),
        (r#""min_p":1.5"#, "min_p"),
        (r#""typical_p":0"#, "typical_p"),
        (r#""frequency_penalty":2.5"#, "frequency_penalty"),
        (r#""presence_penalty":-3"#, "presence_penalty"),
        (r#""repetition_penalty":0"#, "repetition_penalty"),
        (r#""repetition_penalty":"x""#, "repetition_penalty"),
        (r#""logit_bias":{"abc":1}"#, "logit_bias"),
        (r#""logit_bias":{"5":101}"#, "logit_bias"),
        (r#""logit_bias":[1]"#, "logit_bias"),
        (r#""seed":"s""#, "seed"),
        (r#""n":0"#, "n"),
        (r#""n":129"#, "n"),
        (r#""best_of":21"#, "best_of"),
        (r#""n":3,"best_of":2"#, "best_of"),
        (r#""best_of":3,"stream":true"#, "best_of"),
        (r#""stop":["a","b","c","d","e"]"#, "stop"),
        (&format!(r#""stop":["{}"]"#, "x".repeat(513)), "stop"),
        (r#""stop":5"#, "stop"),
        (r#""stop":"a","stop_sequences":"b""#, "stop_sequences"),
        (
            r#""include_stop_str_in_output":1"#,
            "include_stop_str_in_output",
        ),
        (r#""stop_token_ids":[-1]"#, "stop_token_ids"),
        (r#""stop_token_ids":"x""#, "stop_token_ids"),
        (r#""ignore_eos":"yes""#, "ignore_eos"),
        (r#""min_tokens":-1"#, "min_tokens"),
        (r#""min_tokens":5,"max_tokens":2"#, "min_tokens"),
        (r#""echo":3"#, "echo"),
        (r#""logprobs":21"#, "logprobs"),
        (r#""logprobs":"x""#, "logprobs"),
        (r#""logprobs":true,"top_logprobs":21"#, "top_logprobs"),
        (r#""top_logprobs":2"#, "top_logprobs"),
        (r#""logprobs":2,"top_logprobs":2"#, "top_logprobs"),
        (r#""return_token_log_probs":"x""#, "return_token_log_probs"),
        (
            r#""return_tokens_as_token_ids":2"#,
            "return_tokens_as_token_ids",
        ),
        (r#""skip_special_tokens":"no""#, "skip_special_tokens"),
        (r#""mirostat_target":0"#, "mirostat_target"),
        (r#""mirostat_lr":2"#, "mirostat_lr"),
        (r#""dry_multiplier":-1"#, "dry_multiplier"),
        (r#""dry_base":0.5"#, "dry_base"),
        (r#""dry_allowed_length":-1"#, "dry_allowed_length"),
        (r#""dry_sequence_breakers":[""]"#, "dry_sequence_breakers"),
        (r#""dry_sequence_breakers":"x""#, "dry_sequence_breakers"),
        (r#""max_tokens":0"#, "max_tokens"),
        (r#""max_tokens":-1"#, "max_tokens"),
        (r#""max_tokens":5,"max_new_tokens":6"#, "max_new_tokens"),
        (r#""max_completion_tokens":"x""#, "max_completion_tokens"),
        (
            r#""context_length_exceeded_behavior":"drop""#,
            "context_length_exceeded_behavior",
        ),
        (r#""truncate_sequence":"x""#, "truncate_sequence"),
        (r#""suffix":5"#, "suffix"),
        (r#""stream":"x""#, "stream"),
        (
            r#""stream_options":{"include_usage":true}"#,
            "stream_options",
        ),
        (r#""stream_options":{}"#, "stream_options"),
        (
            r#""stream":false,"stream_options":{"include_usage":false}"#,
            "stream_options",
        ),
        (
            r#""stream":true,"stream_options":{"bogus":true}"#,
            "stream_options",
        ),
        (r#""inference_timeout":0"#, "inference_timeout"),
        (r#""inference_timeout":"x""#, "inference_timeout"),
        (r#""prediction":{"type":"x","content":"a"}"#, "prediction"),
        (r#""prediction":"a""#, "prediction"),
        (r#""images":["data:image/png;base64,AAAA"]"#, "images"),
        (r#""modalities":["audio"]"#, "modalities"),
        (r#""audio":{"voice":"x"}"#, "audio"),
        (r#""user":5"#, "user"),
        (
            r#""response_format":{"type":"json_schema"}"#,
            "response_format",
        ),
        (r#""response_format":{"type":"xml"}"#, "response_format"),
        (r#""guided_json":"{not json""#, "guided_json"),
        (r#""guided_regex":5"#, "guided_regex"),
        (r#""guided_choice":[]"#, "guided_choice"),
        (r#""guided_grammar":[1]"#, "guided_grammar"),
        (r#""grammar":{"type":"ebnf","value":"x"}"#, "grammar"),
        (
            r#""guided_regex":"a","guided_choice":["b"]"#,
            "guided_choice",
        ),
        (r#""tool_choice":"required""#, "tool_choice"),
        (
            r#""tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}"#,
            "tool_choice",
        ),
        (r#""tools":[5],"tool_choice":"required""#, "tools"),
        (r#""tools":5"#, "tools"),
        (r#""parallel_tool_calls":"x""#, "parallel_tool_calls"),
        (r#""metadata":"x""#, "metadata"),
        (r#""priority":"high""#, "priority"),
        (r#""inference_extra_params":[1]"#, "inference_extra_params"),
        (r#""inference_extra_headers":5"#, "inference_extra_headers"),
        (r#""bogus":1"#, "bogus"),
        (r#""prompt2":1"#, "prompt2"),
    ];
    for (extra, field) in cases {
        let body = with(extra);
        let err = parse(&body).expect_err(&body);
        assert_eq!(param_of(err), Some(field.to_string()), "{body}");
    }
    for (body, field) in [
        (r#"{"model":"m"}"#, "prompt"),
        (r#"{"model":"m","prompt":[-1]}"#, "prompt"),
        (r#"{"prompt":"x"}"#, "model"),
    ] {
        let err = parse(body).expect_err(body);
        assert_eq!(param_of(err), Some(field.to_string()), "{body}");
    }
}

#[test]
fn logprobs_spellings_resolve() {
    let lp = |extra: &str| parse(&with(extra)).unwrap().output.logprobs;
    assert_eq!(lp(r#""logprobs":3"#), Some(3));
    assert_eq!(lp(r#""logprobs":0"#), Some(0));
    assert_eq!(lp(r#""logprobs":true"#), Some(0));
    assert_eq!(lp(r#""logprobs":true,"top_logprobs":5"#), Some(5));
    assert_eq!(lp(r#""logprobs":false"#), None);
    assert_eq!(lp(r#""return_token_log_probs":true"#), Some(0));
}

#[test]
fn fields_with_meaning_resolve() {
    let p = parse(&with(
        r#""logit_bias":{"7":100},"repetition_penalty":1.3,"dry_multiplier":0.8,"mirostat_target":4,"min_tokens":2,"stop_token_ids":[5],"echo":true,"max_tokens":5,"best_of":3,"n":2,"context_length_exceeded_behavior":"error","prediction":{"type":"content","content":[{"type":"text","text":"ab"},{"type":"text","text":"c"}]}"#,
    ))
    .unwrap();
    assert_eq!(p.sampling.logit_bias, vec![(7, 100.0)]);
    assert!(p.sampling.dry.is_some());
    assert_eq!(p.dry_breakers.len(), 4);
    assert_eq!(p.sampling.mirostat.unwrap().learning_rate, 0.1);
    assert_eq!((p.min_tokens, p.max_tokens), (2, Some(5)));
    let scoring = parse(&with(r#""echo":true,"max_tokens":0,"logprobs":1"#)).unwrap();
    assert_eq!(scoring.max_tokens, Some(0));
    assert_eq!((p.n, p.best_of), (2, 3));
    assert_eq!(p.overflow, Overflow::Error);
    assert_eq!(p.prediction.as_deref(), Some("abc"));
    // DRY settings with a zero multiplier leave DRY off.
    let p = parse(&with(r#""dry_multiplier":0,"dry_base":2"#)).unwrap();
    assert_eq!(p.sampling.dry, None);
}

#[test]
fn neutral_structured_output_fields_constrain_nothing() {
    let p = parse(&with(
        r#""response_format":{"type":"text"},"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"auto","metadata":{"a":1},"priority":3,"modalities":["text"],"images":[]"#,
    ))
    .unwrap();
    assert_eq!(p.constraint, None);
}

#[test]
fn each_structured_output_field_becomes_a_grammar() {
    use ferrite_engine::constrain::GrammarKind::*;
    let cases = [
        (
            r#""response_format":{"type":"json_object"}"#,
            "response_format",
            JsonSchema,
        ),
        (
            r#""response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"integer"},"strict":true}}"#,
            "response_format",
            JsonSchema,
        ),
        (
            r#""response_format":{"type":"grammar","grammar":"start: \"a\""}"#,
            "response_format",
            Llguidance,
        ),
        (
            r#""guided_json":"{\"type\":\"string\"}""#,
            "guided_json",
            JsonSchema,
        ),
        (r#""guided_regex":"\\d+""#, "guided_regex", Regex),
        (r#""guided_choice":["a.b","c"]"#, "guided_choice", Regex),
        (r#""guided_grammar":"start: \"x\"""#, "guided_grammar", Lark),
        (
            r#""grammar":{"type":"json_schema","value":{"type":"object"}}"#,
            "grammar",
            JsonSchema,
        ),
        (
            r#""tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"required""#,
            "tool_choice",
            JsonSchema,
        ),
    ];
    for (extra, field, kind) in cases {
        let c = parse(&with(extra)).unwrap().constraint.expect(extra);
        assert_eq!((c.field, c.grammar.kind), (field, kind), "{extra}");
    }
    let choice = parse(&with(r#""guided_choice":["a.b","c"]"#))
        .unwrap()
        .constraint
        .unwrap();
    assert_eq!(choice.grammar.source, r"(a\.b)|(c)");
}

#[test]
fn shape_errors_say_what_shapes_are_allowed() {
    let err = parse(r#"{"model":"m","prompt":{"a":1}}"#).unwrap_err();
    assert!(
        err.to_string()
            .contains("must be a string, an array of strings"),
        "{err}"
    );
}

#[test]
fn bad_json_is_a_400_without_param() {
    let err = parse_body(b"{not json", false).unwrap_err();
    assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST);
    assert_eq!(param_of(err), None);
}

/// Each of the operator's field limits is the one in force: a field at the limit passes,
/// one past it is a 400 naming the field and the flag.
#[test]
fn field_limits_are_the_ones_given() {
    let limits = FieldLimits {
        max_stop_bytes: 3,
        max_stop_token_ids: 2,
        max_logit_bias: 1,
        max_allowed_token_ids: 2,
        max_dry_breakers: 1,
        max_tool_name_bytes: 2,
    };
    let tool = |name: &str| {
        format!(
            r#""tools":[{{"type":"function","function":{{"name":"{name}"}}}}],"tool_choice":"required""#
        )
    };
    let cases = [
        (
            r#""stop":"abc""#.to_string(),
            r#""stop":"abcd""#.to_string(),
            "stop",
            "--max-stop-bytes",
        ),
        (
            r#""stop_token_ids":[1,2]"#.into(),
            r#""stop_token_ids":[1,2,3]"#.into(),
            "stop_token_ids",
            "--max-stop-token-ids",
        ),
        (
            r#""logit_bias":{"1":1}"#.into(),
            r#""logit_bias":{"1":1,"2":1}"#.into(),
            "logit_bias",
            "--max-logit-bias",
        ),
        (
            r#""allowed_token_ids":[1,2]"#.into(),
            r#""allowed_token_ids":[1,2,3]"#.into(),
            "allowed_token_ids",
            "--max-allowed-token-ids",
        ),
        (
            r#""dry_sequence_breakers":["a"]"#.into(),
            r#""dry_sequence_breakers":["a","b"]"#.into(),
            "dry_sequence_breakers",
            "--max-dry-breakers",
        ),
        (tool("ab"), tool("abc"), "tools", "--max-tool-name-bytes"),
    ];
    let with = |field: &str| {
        let body = format!(r#"{{"model":"m","prompt":"x",{field}}}"#);
        GenerateParams::new(parse_body(body.as_bytes(), false).unwrap(), &limits)
    };
    for (fits, over, param, flag) in cases {
        assert!(with(&fits).is_ok(), "{fits}");
        let err = with(&over).unwrap_err();
        let message = format!("{err:?}");
        assert!(message.contains(flag), "{over}: {message}");
        assert_eq!(param_of(err).as_deref(), Some(param), "{over}");
        // The defaults take both.
        let body = format!(r#"{{"model":"m","prompt":"x",{over}}}"#);
        assert!(parse(&body).is_ok(), "{over}");
    }
}
