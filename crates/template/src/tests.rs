//! The language as Go's text/template has it: actions, control structures, variables,
//! services as records, missing keys, delimiters, parse errors, and the budget.

use std::collections::BTreeMap;

use super::*;

/// Data for tests: an environment, and services by name.
#[derive(Default)]
struct TestData {
    env: BTreeMap<String, String>,
    services: BTreeMap<String, Vec<Value>>,
    asked: Vec<String>,
}

impl Data for TestData {
    fn call(&mut self, function: &str, args: &[Value]) -> Result<Value, CallError> {
        self.asked.push(function.to_string());
        let name = args.first().and_then(Value::as_str).unwrap_or_default();
        match function {
            "env" => Ok(Value::str(self.env.get(name).cloned().unwrap_or_default())),
            "nomadService" => Ok(Value::list(
                self.services.get(name).cloned().unwrap_or_default(),
            )),
            other => Err(format!("no {other} in this test").into()),
        }
    }
}

fn service(name: &str, address: &str, port: i64, tags: &[&str]) -> Value {
    Value::object(
        "service",
        BTreeMap::from([
            ("Name", Value::str(name)),
            ("Address", Value::str(address)),
            ("Port", Value::Int(port)),
            (
                "Tags",
                Value::list(tags.iter().map(|t| Value::str(*t)).collect()),
            ),
        ]),
    )
}

fn render_with(text: &str, data: &mut TestData) -> Result<String, String> {
    let template = Template::parse(text, &Delimiters::default()).map_err(|e| e.to_string())?;
    template
        .render(data, &RenderOptions::default())
        .map_err(|e| e.to_string())
}

fn render(text: &str) -> Result<String, String> {
    render_with(text, &mut TestData::default())
}

fn ok(text: &str) -> String {
    render(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

#[test]
fn text_actions_trims_and_comments() {
    assert_eq!(ok("a {{ \"b\" }} c"), "a b c");
    assert_eq!(ok("a  {{- \"b\" -}}  \n c"), "abc");
    assert_eq!(ok("x{{/* a comment */}}y{{- /* trimmed */ -}}  z"), "xyz");
    assert_eq!(ok("{{-3}}"), "-3");
    assert_eq!(
        ok("{{ 1.5 }} {{ 0x10 }} {{ 'a' }} {{ true }} {{ `raw\\n` }}"),
        "1.5 16 97 true raw\\n"
    );
}

#[test]
fn control_structures_behave_as_go_s() {
    assert_eq!(
        ok("{{ if eq 1 2 }}a{{ else if eq 1 1 }}b{{ else }}c{{ end }}"),
        "b"
    );
    assert_eq!(
        ok("{{ with \"\" }}x{{ else with \"y\" }}{{ . }}{{ end }}"),
        "y"
    );
    assert_eq!(
        ok("{{ range $i, $e := split \",\" \"a,b,c\" }}{{ $i }}={{ $e }};{{ end }}"),
        "0=a;1=b;2=c;"
    );
    assert_eq!(
        ok("{{ range split \",\" \"\" }}x{{ else }}none{{ end }}"),
        "none"
    );
    assert_eq!(
        ok(
            "{{ range loop 10 }}{{ if eq . 3 }}{{ break }}{{ end }}{{ if eq . 1 }}{{ continue }}{{ end }}{{ . }}{{ end }}"
        ),
        "02"
    );
    assert_eq!(ok("{{ range 3 }}{{ . }}{{ end }}"), "012");
    assert_eq!(
        ok("{{ $x := 1 }}{{ if true }}{{ $x = 2 }}{{ end }}{{ $x }}"),
        "2"
    );
    assert_eq!(
        ok(
            "{{ define \"t\" }}<{{ . }}>{{ end }}{{ template \"t\" \"a\" }}{{ block \"b\" 5 }}[{{ . }}]{{ end }}"
        ),
        "<a>[5]"
    );
    assert_eq!(
        ok("{{ executeTemplate \"t\" 1 | printf \"%s!\" }}{{ define \"t\" }}{{ . }}{{ end }}"),
        "1!"
    );
    assert_eq!(
        ok("{{ range $k, $v := parseJSON `{\"b\":2,\"a\":1}` }}{{ $k }}{{ $v }}{{ end }}"),
        "a1b2"
    );
    assert_eq!(ok("{{ (parseJSON `{\"a\":{\"b\":[7]}}`).a.b }}"), "[7]");
    assert_eq!(
        ok("{{ and 1 0 }} {{ or 0 \"\" 3 }} {{ not true }}"),
        "0 3 false"
    );
}

#[test]
fn services_range_as_records() {
    let mut data = TestData::default();
    data.services.insert(
        "web".into(),
        vec![
            service("web", "10.0.0.1", 8080, &["a"]),
            service("web", "10.0.0.2", 8081, &["a", "b"]),
        ],
    );
    let text = "{{ range nomadService \"web\" }}server {{ .Address }}:{{ .Port }};\n{{ end }}\
                {{ range $tag, $s := nomadService \"web\" | byTag }}{{ $tag }}={{ len $s }} {{ end }}";
    assert_eq!(
        render_with(text, &mut data).unwrap(),
        "server 10.0.0.1:8080;\nserver 10.0.0.2:8081;\na=2 b=1 "
    );
    let error = render_with(
        "{{ range nomadService \"web\" }}{{ .Nope }}{{ end }}",
        &mut data,
    )
    .unwrap_err();
    assert!(
        error.contains("can't evaluate field Nope in type service"),
        "{error}"
    );
}

#[test]
fn a_missing_key_prints_no_value_or_is_named_when_asked() {
    assert_eq!(ok("{{ (parseJSON `{}`).port }}"), "<no value>");
    let template =
        Template::parse("a\n{{ (parseJSON `{}`).port }}", &Delimiters::default()).unwrap();
    let options = RenderOptions {
        missing_key: MissingKey::Error,
        ..RenderOptions::default()
    };
    let error = template
        .render(&mut TestData::default(), &options)
        .unwrap_err()
        .to_string();
    assert_eq!(error, "line 2: map has no entry for key \"port\"");
}

#[test]
fn custom_delimiters() {
    let template = Template::parse(
        "{{ not me }} [[ env \"A\" ]]",
        &Delimiters {
            left: "[[".into(),
            right: "]]".into(),
        },
    )
    .unwrap();
    let mut data = TestData::default();
    data.env.insert("A".into(), "1".into());
    assert_eq!(
        template
            .render(&mut data, &RenderOptions::default())
            .unwrap(),
        "{{ not me }} 1"
    );
}

#[test]
fn parse_errors_name_the_line_and_the_problem() {
    let cases = [
        ("{{ nope 1 }}", "line 1: function \"nope\" not defined"),
        (
            "a\n{{ secret \"x\" }}",
            "line 2: template function \"secret\" is not supported: it reads Vault",
        ),
        (
            "{{ sprig_nope }}",
            "template function \"sprig_nope\" is not supported",
        ),
        ("{{ if true }}x", "an {{end}} is missing"),
        ("{{ end }}", "unexpected {{end}}"),
        ("{{ $x }}", "undefined variable \"$x\""),
        ("{{ break }}", "{{break}} outside {{range}}"),
        ("{{ \"a\" ", "never closed"),
        ("{{ 1 | }}", "a pipeline ends with |"),
        (
            "{{ if true }}{{ define \"x\" }}{{ end }}{{ end }}",
            "define is allowed only at the top",
        ),
    ];
    for (text, expected) in cases {
        let error = Template::parse(text, &Delimiters::default())
            .unwrap_err()
            .to_string();
        assert!(error.contains(expected), "{text:?}: {error}");
    }
    let deep = "{{ if true }}".repeat(200) + &"{{ end }}".repeat(200);
    let error = Template::parse(&deep, &Delimiters::default())
        .unwrap_err()
        .to_string();
    assert!(error.contains("more than 100 nested"), "{error}");
}

#[test]
fn non_functions_take_no_arguments_and_types_are_checked() {
    assert!(
        render("{{ 1 2 }}")
            .unwrap_err()
            .contains("can't give argument to non-function")
    );
    assert!(
        render("{{ eq 1 \"1\" }}")
            .unwrap_err()
            .contains("incompatible types for comparison")
    );
    assert!(
        render("{{ index (split \",\" \"a\") 3 }}")
            .unwrap_err()
            .contains("index out of range: 3")
    );
    assert!(
        render("{{ .x }}")
            .unwrap_err()
            .contains("nil data; no entry for key \"x\"")
    );
}

#[test]
fn loops_without_end_and_huge_output_are_bounded() {
    let template = Template::parse(
        "{{ range loop 1000000000000 }}x{{ end }}",
        &Delimiters::default(),
    )
    .unwrap();
    let options = RenderOptions {
        limits: Limits {
            max_output: usize::MAX,
            max_steps: 1_000_000,
            ..Limits::default()
        },
        ..RenderOptions::default()
    };
    let error = template
        .render(&mut TestData::default(), &options)
        .unwrap_err();
    assert_eq!(error, RenderError::TooManySteps { limit: 1_000_000 });
    let options = RenderOptions {
        limits: Limits {
            max_output: 1 << 20,
            ..Limits::default()
        },
        ..RenderOptions::default()
    };
    let error = template
        .render(&mut TestData::default(), &options)
        .unwrap_err();
    assert_eq!(error, RenderError::TooLarge { limit: 1 << 20 });
    // A string doubled in a loop is stopped at the limit, not when memory runs out.
    let doubling = "{{ $s := \"xx\" }}{{ range loop 64 }}{{ $s = printf \"%s%s\" $s $s }}{{ end }}";
    let error = Template::parse(doubling, &Delimiters::default())
        .unwrap()
        .render(&mut TestData::default(), &options)
        .unwrap_err();
    assert!(
        matches!(error, RenderError::TooLarge { .. } | RenderError::At { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("1048576"), "{error}");
    // Templates that call themselves end at the depth limit.
    let recursive = "{{ define \"r\" }}{{ template \"r\" . }}{{ end }}{{ template \"r\" }}";
    let error = Template::parse(recursive, &Delimiters::default())
        .unwrap()
        .render(&mut TestData::default(), &options)
        .unwrap_err();
    assert!(
        matches!(error, RenderError::TooDeep { limit: 200, .. }),
        "{error}"
    );
}

/// What a hostile job author wrote to stop the agent (each found by an attack on this
/// engine): every one ends with an error, in bounded time, within the agent's limits.
#[test]
fn hostile_templates_end_with_an_error_not_a_crash() {
    let limits = Limits {
        max_output: 4 << 20,
        max_steps: 5_000_000,
        max_time: std::time::Duration::from_secs(2),
        max_memory: 64 << 20,
        max_depth: 200,
    };
    let big = "{{ $s := sprig_repeat 4000000 \"x\" }}";
    let cases: &[(&str, &str)] = &[
        // Values nested until the stack overflows when dropped or printed.
        (
            "{{ $a := sprig_list 1 }}{{ range loop 60000 }}{{ $a = sprig_list $a }}{{ end }}done",
            "nest at most 32 deep",
        ),
        // Shared values doubling: each level walks what it holds.
        (
            "{{ $a := sprig_list \"xxxxxxxx\" }}{{ range loop 40 }}{{ $a = sprig_list $a $a }}{{ end }}{{ $a }}",
            "steps",
        ),
        // Nesting and template calls multiplied.
        (
            &format!(
                "{{{{ define \"a\" }}}}{}{{{{ template \"a\" . }}}}{}{{{{ end }}}}{{{{ template \"a\" 1 }}}}",
                "{{ if 1 }}".repeat(40),
                "{{ end }}".repeat(40)
            ),
            "more than 200 deep",
        ),
        // A billion integers, walked or made inside one call.
        ("{{ loop 0 100000000000 }}", "bytes"),
        ("{{ toJSON (loop 0 100000000000) }}", "steps"),
        ("{{ join \",\" (loop 0 100000000000) }}", "steps"),
        ("{{ in (loop 0 9000000000000000000) -1 }}", "steps"),
        (
            "{{ slice (loop 0 9000000000000000000) 8999999999999999999 | len }}",
            "steps",
        ),
        ("{{ sprig_uniq (loop 0 300000) }}", "steps"),
        ("{{ sprig_sortAlpha (loop 0 100000000) }}", "steps"),
        (
            "{{ split \",\" \"a,b\" | containsAll (loop 0 100000000) }}",
            "steps",
        ),
        // Big strings many times over.
        (
            &format!("{big}{{{{ print $s $s $s $s $s $s $s $s $s $s }}}}"),
            "bytes",
        ),
        (
            &format!("{big}{{{{ regexReplaceAll \"\" $s $s }}}}"),
            "bytes",
        ),
        (
            &format!(
                "{big}{{{{ $l := sprig_list }}}}{{{{ range loop 100 }}}}{{{{ $l = split \"\" $s }}}}{{{{ end }}}}"
            ),
            "bytes of values",
        ),
        // A second attack: work a shallow charge missed.
        (
            &format!("{big}{{{{ regexMatch \"[0-7][0-9a-f]{{1000}}[^0-9a-f]\" $s }}}}"),
            "at most 65536 bytes",
        ),
        (
            &format!(
                "{big}{{{{ $l := sprig_list $s $s $s $s $s }}}}{{{{ printf \"\" {} }}}}",
                "$l ".repeat(20)
            ),
            "bytes",
        ),
        (
            &format!(
                "{big}{{{{ $l := sprig_list $s $s $s $s }}}}{{{{ $m := sprig_list {} }}}}{{{{ len (toJSON $m) }}}}",
                "$l ".repeat(30)
            ),
            "bytes",
        ),
        (
            &format!(
                "{big}{{{{ $l := sprig_list $s $s $s $s }}}}{{{{ $m := sprig_list {} }}}}{{{{ $r := sprig_sortAlpha $m }}}}",
                "$l ".repeat(30)
            ),
            "bytes of values",
        ),
        (
            &format!(
                "{{{{ $j := print \"[\" (sprig_repeat 1000000 \"[],\") \"[]]\" }}}}{}",
                "{{ $p := parseJSON $j }}".repeat(70)
            ),
            "bytes of values",
        ),
        // Rust's formatter panics past 65,535 digits.
        ("{{ printf \"%.65536f\" 1.5 }}", "a precision past 1000"),
    ];
    for (text, expected) in cases {
        let started = std::time::Instant::now();
        let template = Template::parse(text, &Delimiters::default()).unwrap();
        let options = RenderOptions {
            limits: limits.clone(),
            ..RenderOptions::default()
        };
        let error = template
            .render(&mut TestData::default(), &options)
            .unwrap_err()
            .to_string();
        assert!(error.contains(expected), "{text}: {error}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{text}: {:?}",
            started.elapsed()
        );
    }
}

/// `trim` with a long cutset looks each character up (it scanned the cutset for each
/// character of the text: 51 s for a megabyte of each).
#[test]
fn trim_with_a_long_cutset_is_linear() {
    let text = "{{ $b := sprig_repeat 1048576 \"a\" }}{{ $c := print (sprig_repeat 1048575 \"b\") \"a\" }}{{ len (sprig_trimAll $c $b) }}";
    let started = std::time::Instant::now();
    let rendered = Template::parse(text, &Delimiters::default())
        .unwrap()
        .render(&mut TestData::default(), &RenderOptions::default())
        .unwrap();
    assert_eq!(rendered, "0");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

/// Many variables parse in linear time (each use looked up, not scanned for).
#[test]
fn many_variables_parse_in_linear_time() {
    let mut text = "{{ $a := 1 }}".repeat(21_000);
    text.push_str("{{ $b := 1 }}");
    text.push_str(&"{{ print $b $b $b $b }}".repeat(2_000));
    let started = std::time::Instant::now();
    Template::parse(&text, &Delimiters::default()).unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// A long `else if` chain parses in linear time (it was copied back into the stream
/// once per branch: 150,000 branches took minutes).
#[test]
fn a_long_else_if_chain_parses_in_linear_time() {
    let text = format!(
        "{{{{ if 0 }}}}{}x{{{{ end }}}}",
        "{{ else if 0 }}".repeat(50_000)
    );
    let started = std::time::Instant::now();
    let template = Template::parse(&text, &Delimiters::default()).unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        template
            .render(&mut TestData::default(), &RenderOptions::default())
            .unwrap(),
        ""
    );
}

proptest::proptest! {
    /// No input makes the parser or the renderer panic: each ends with a template or
    /// an error.
    #[test]
    fn no_text_panics(parts in proptest::collection::vec(proptest::sample::select(vec![
        "{{", "}}", "{{-", " -}}", " ", "if", "else", "end", "range", "with", "define", "template",
        "block", "break", "continue", "$x", ":=", "=", "$", ".", ".A", "(", ")", "|", ",", "\"s\"",
        "`r`", "'c'", "1", "-2", "0x", "1.5e", "printf", "\"%d\"", "index", "slice", "loop", "split",
        "len", "eq", "and", "/*", "*/", "\n", "\\", "é",
    ]), 0..40)) {
        let text: String = parts.concat();
        if let Ok(template) = Template::parse(&text, &Delimiters::default()) {
            let options = RenderOptions {
                limits: Limits { max_steps: 10_000, max_output: 1 << 16, ..Limits::default() },
                ..RenderOptions::default()
            };
            let _ = template.render(&mut TestData::default(), &options);
        }
    }
}
