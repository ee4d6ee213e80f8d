use serde_json::json;

use super::*;

fn tokens() -> SpecialTokens {
    SpecialTokens {
        bos: "<s>".into(),
        eos: "</s>".into(),
        add_bos: false,
        add_eos: false,
    }
}

fn render(source: &str, messages: &[Json]) -> Result<String, TemplateError> {
    ChatTemplate::new(source, tokens())?.render(&Conversation {
        messages,
        tools: None,
        add_generation_prompt: true,
        extra: None,
    })
}

#[test]
fn chatml_renders_each_turn_and_the_assistant_prompt() {
    let messages = [
        json!({"role": "system", "content": "Be brief."}),
        json!({"role": "user", "content": "Hi"}),
    ];
    assert_eq!(
        render(CHATML, &messages).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn blocks_are_trimmed_as_transformers_renders_them() {
    // trim_blocks drops the newline after a block tag, lstrip_blocks the indentation
    // before one; the template's final newline goes too.
    let source = "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n";
    let messages = [
        json!({"role": "user", "content": "a"}),
        json!({"role": "user", "content": "b"}),
    ];
    assert_eq!(render(source, &messages).unwrap(), "[a]\n[b]\n");
}

#[test]
fn python_string_methods_work() {
    let source =
        "{{ messages[0].content.strip().upper() }}|{{ messages[0].content.startswith('  x') }}";
    let messages = [json!({"role": "user", "content": "  x y "})];
    // Booleans print as Python prints them.
    assert_eq!(render(source, &messages).unwrap(), "X Y|True");
}

#[test]
fn tojson_writes_as_pythons_json_dumps() {
    let tool =
        json!({"name": "f", "parameters": {"type": "object", "b": [1, 2.5, "é\n"], "a": {}}});
    let tools = [tool];
    let template = ChatTemplate::new(
        "{{ tools[0] | tojson }}\n{{ tools[0].parameters.b | tojson(indent=2) }}",
        tokens(),
    )
    .unwrap();
    let text = template
        .render(&Conversation {
            messages: &[],
            tools: Some(&tools),
            add_generation_prompt: false,
            extra: None,
        })
        .unwrap();
    // Keys keep their order, Python's separators, non-ASCII as it is.
    assert_eq!(
        text,
        "{\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"b\": [1, 2.5, \"é\\n\"], \"a\": {}}}\n[\n  1,\n  2.5,\n  \"é\\n\"\n]"
    );
}

#[test]
fn python_numbers() {
    let n = |v: Json| match v {
        Json::Number(n) => crate::pyjson::python_number(&n),
        _ => unreachable!(),
    };
    assert_eq!(n(json!(1.0)), "1.0");
    assert_eq!(n(json!(0.1)), "0.1");
    assert_eq!(n(json!(1.5e-7)), "1.5e-07");
    assert_eq!(n(json!(1e20)), "1e+20");
    assert_eq!(n(json!(1e16)), "1e+16");
    assert_eq!(n(json!(1e15)), "1000000000000000.0");
    assert_eq!(n(json!(123456789.0)), "123456789.0");
    assert_eq!(n(json!(1e-4)), "0.0001");
    assert_eq!(n(json!(1e-5)), "1e-05");
    assert_eq!(n(json!(5e-5)), "5e-05");
    assert_eq!(n(json!(-2.5e-3)), "-0.0025");
    assert_eq!(n(json!(-3)), "-3");
}

#[test]
fn raise_exception_gives_the_templates_message() {
    let source = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}";
    let err = render(source, &[json!({"role": "assistant", "content": "x"})]).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("Conversation roles must alternate user/assistant"),
        "{err}"
    );
}

#[test]
fn a_syntax_error_is_an_error_naming_the_line() {
    let err = ChatTemplate::new("line one\n{% for m in messages %}", tokens()).unwrap_err();
    assert!(err.to_string().contains("line"), "{err}");
}

#[test]
fn a_runaway_template_runs_out_of_fuel() {
    let source = "{% for a in range(10000) %}{% for b in range(10000) %}{% endfor %}{% endfor %}";
    let err = render(source, &[]).unwrap_err();
    assert!(err.to_string().contains("fuel"), "{err}");
}

#[test]
fn strftime_now_formats_the_date_and_refuses_bad_formats() {
    let text = render("{{ strftime_now('%Y') }}", &[]).unwrap();
    assert_eq!(text.len(), 4, "{text}");
    assert!(text.chars().all(|c| c.is_ascii_digit()));
    assert!(render("{{ strftime_now('%Q%') }}", &[]).is_err());
}

#[test]
fn a_leading_bos_goes_where_the_tokenizer_adds_one() {
    let source = "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}";
    let messages = [json!({"role": "user", "content": "x"})];
    let mut special = tokens();
    let conversation = Conversation {
        messages: &messages,
        tools: None,
        add_generation_prompt: false,
        extra: None,
    };
    let plain = ChatTemplate::new(source, special.clone()).unwrap();
    assert_eq!(plain.render(&conversation).unwrap(), "<s>x</s>");
    special.add_bos = true;
    special.add_eos = true;
    let stripped = ChatTemplate::new(source, special).unwrap();
    assert_eq!(stripped.render(&conversation).unwrap(), "x");
}

#[test]
fn tools_are_none_without_any() {
    // As transformers passes them: Mistral's template tests `tools is not none`.
    let source = "{% if tools is not none %}tools{% else %}none{% endif %}";
    assert_eq!(render(source, &[]).unwrap(), "none");
}

#[test]
fn tojson_takes_transformers_arguments() {
    let template = ChatTemplate::new(
        "{{ messages[0] | tojson(true) }} {{ messages[0] | tojson(ensure_ascii=true, sort_keys=true, separators=[',', ':']) }}",
        tokens(),
    )
    .unwrap();
    let messages = [json!({"z": "é\u{7f}", "a": 1})];
    let text = template
        .render(&Conversation {
            messages: &messages,
            tools: None,
            add_generation_prompt: false,
            extra: None,
        })
        .unwrap();
    assert_eq!(
        text,
        "{\"z\": \"\\u00e9\\u007f\", \"a\": 1} {\"a\":1,\"z\":\"\\u00e9\\u007f\"}"
    );
}

#[test]
fn extra_variables_reach_the_template_but_cannot_replace_its_own() {
    let extra: serde_json::Map<String, Json> =
        serde_json::from_str(r#"{"enable_thinking": false, "bos_token": "X"}"#).unwrap();
    let got = ChatTemplate::new(
        "{{ bos_token }}{% if enable_thinking is false %}no thinking{% endif %}",
        tokens(),
    )
    .unwrap()
    .render(&Conversation {
        messages: &[],
        tools: None,
        add_generation_prompt: false,
        extra: Some(&extra),
    })
    .unwrap();
    assert_eq!(got, "<s>no thinking");
}

#[test]
fn a_template_that_writes_too_much_is_stopped_at_its_limit() {
    // Fuel bounds the loop's turns, not what each writes.
    let source = "{% for i in range(n) %}{% for j in range(n) %}{{ messages[0].content }}{% endfor %}{% endfor %}";
    let mut template = ChatTemplate::new(source, tokens()).unwrap();
    template.limit_output(1 << 20);
    let messages = [json!({"role": "user", "content": "x".repeat(1 << 10)})];
    let render = |n: u64| {
        let extra = serde_json::Map::from_iter([("n".to_string(), json!(n))]);
        template.render(&Conversation {
            messages: &messages,
            tools: None,
            add_generation_prompt: false,
            extra: Some(&extra),
        })
    };
    assert_eq!(render(32).unwrap().len(), 1 << 20);
    // A gigabyte asked for.
    let err = render(1000).unwrap_err();
    assert!(err.to_string().contains("1048576 bytes"), "{err}");
}
