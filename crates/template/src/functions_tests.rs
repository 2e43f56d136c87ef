//! Every function [`FUNCTIONS`] says berth computes, rendered; and the table in
//! `docs/templates.md` equal to [`FUNCTIONS`].

use std::collections::{BTreeMap, BTreeSet};

use crate::{CallError, Data, Delimiters, FUNCTIONS, RenderOptions, Support, Template, Value};

/// No outside data but an empty environment, and a Consul key tree `tree` answers as
/// consul-template's does (for the functions that reshape one).
struct NoData;

impl Data for NoData {
    fn call(&mut self, function: &str, _: &[Value]) -> Result<Value, CallError> {
        match function {
            "env" => Ok(Value::str("")),
            "tree" => Ok(Value::list(
                [("es/a", "1"), ("es/b", "2"), ("redis/a", "3"), ("top", "4")]
                    .into_iter()
                    .map(|(key, value)| {
                        Value::object(
                            "KeyPair",
                            std::collections::BTreeMap::from([
                                ("Key", Value::str(key)),
                                ("Value", Value::str(value)),
                            ]),
                        )
                    })
                    .collect(),
            )),
            other => Err(format!("no {other} here").into()),
        }
    }
}

/// (function, template, what it renders): at least one per computed function.
const CASES: &[(&str, &str, &str)] = &[
    ("and", "{{ and 1 2 }}", "2"),
    ("or", "{{ or 0 2 }}", "2"),
    ("not", "{{ not 0 }}", "true"),
    ("len", "{{ len \"abc\" }}", "3"),
    ("index", "{{ index (split \",\" \"a,b\") 1 }}", "b"),
    (
        "slice",
        "{{ slice \"abcdef\" 1 3 }} {{ slice (split \",\" \"a,b,c\") 1 }}",
        "bc [b c]",
    ),
    ("print", "{{ print 1 2 \"a\" 3 }}", "1 2a3"),
    ("printf", "{{ printf \"%s-%03d\" \"a\" 7 }}", "a-007"),
    ("println", "{{ println 1 \"a\" }}", "1 a\n"),
    ("eq", "{{ eq 1 2 1 }}", "true"),
    ("ne", "{{ ne \"a\" \"b\" }}", "true"),
    ("lt", "{{ lt 1 2 }}", "true"),
    ("le", "{{ le 2 2 }}", "true"),
    ("gt", "{{ gt \"b\" \"a\" }}", "true"),
    ("ge", "{{ ge 1.5 2 }}", "false"),
    ("html", "{{ html \"<a&b>\" }}", "&lt;a&amp;b&gt;"),
    ("js", "{{ js \"it's\" }}", "it\\'s"),
    ("urlquery", "{{ urlquery \"a b&c\" }}", "a+b%26c"),
    (
        "executeTemplate",
        "{{ define \"x\" }}[{{ . }}]{{ end }}{{ executeTemplate \"x\" 3 }}",
        "[3]",
    ),
    ("base64Decode", "{{ base64Decode \"aGk=\" }}", "hi"),
    ("base64Encode", "{{ base64Encode \"hi\" }}", "aGk="),
    ("base64URLDecode", "{{ base64URLDecode \"Pz8-\" }}", "??>"),
    ("base64URLEncode", "{{ base64URLEncode \"??>\" }}", "Pz8-"),
    ("byTag", "{{ len (byTag (split \",\" \"\")) }}", "0"),
    (
        "byKey",
        "{{ range $dir, $pairs := tree \"g\" | byKey }}{{ $dir }}:{{ range $pairs }}{{ .Key }}={{ .Value }},{{ end }};{{ end }}",
        "es:a=1,b=2,;redis:a=3,;",
    ),
    (
        "explode",
        "{{ $t := tree \"g\" | explode }}{{ $t.es.b }}{{ $t.redis.a }}{{ $t.top }}",
        "234",
    ),
    (
        "explodeMap",
        "{{ $m := parseJSON `{\"a/b\":\"1\",\"a/c\":\"2\",\"d\":\"3\"}` | explodeMap }}{{ $m.a.b }}{{ $m.a.c }}{{ $m.d }}",
        "123",
    ),
    (
        "contains",
        "{{ split \",\" \"a,b\" | contains \"b\" }}",
        "true",
    ),
    (
        "containsAll",
        "{{ split \",\" \"a,b,c\" | containsAll (split \",\" \"a,c\") }}",
        "true",
    ),
    (
        "containsAny",
        "{{ split \",\" \"a,b\" | containsAny (split \",\" \"x,b\") }}",
        "true",
    ),
    (
        "containsNone",
        "{{ split \",\" \"a,b\" | containsNone (split \",\" \"x,y\") }}",
        "true",
    ),
    (
        "containsNotAll",
        "{{ split \",\" \"a,b\" | containsNotAll (split \",\" \"a,y\") }}",
        "true",
    ),
    (
        "envOrDefault",
        "{{ envOrDefault \"UNSET\" \"dflt\" }}",
        "dflt",
    ),
    ("in", "{{ in \"abc\" \"b\" }}", "true"),
    ("indent", "{{ indent 2 \"a\\nb\" }}", "  a\n  b"),
    ("join", "{{ split \",\" \"a,b\" | join \";\" }}", "a;b"),
    ("loop", "{{ range loop 2 4 }}{{ . }}{{ end }}", "23"),
    (
        "mergeMap",
        "{{ mergeMap (parseJSON `{\"a\":1,\"b\":1}`) (parseJSON `{\"b\":2}`) }}",
        "map[a:1 b:2]",
    ),
    (
        "mergeMapWithOverride",
        "{{ mergeMapWithOverride (parseJSON `{\"b\":1}`) (parseJSON `{\"a\":1,\"b\":2}`) }}",
        "map[a:1 b:1]",
    ),
    ("parseBool", "{{ parseBool \"true\" }}", "true"),
    ("parseFloat", "{{ parseFloat \"1.5\" }}", "1.5"),
    ("parseInt", "{{ add 1 (parseInt \"41\") }}", "42"),
    ("parseJSON", "{{ (parseJSON `{\"a\":[1,2]}`).a }}", "[1 2]"),
    ("parseUint", "{{ parseUint \"7\" }}", "7"),
    ("regexMatch", "{{ regexMatch \"^a+$\" \"aaa\" }}", "true"),
    (
        "regexReplaceAll",
        "{{ regexReplaceAll \"(a)(b)\" \"$2$1\" \"xaby\" }}",
        "xbay",
    ),
    ("replaceAll", "{{ replaceAll \"a\" \"b\" \"aXa\" }}", "bXb"),
    (
        "sha256Hex",
        "{{ sha256Hex \"abc\" }}",
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    ),
    ("split", "{{ split \":\" \"a:b\" }}", "[a b]"),
    (
        "splitToMap",
        "{{ splitToMap \",\" \"=\" \"a=1,b=2\" }}",
        "map[a:1 b:2]",
    ),
    (
        "timestamp",
        "{{ len (timestamp) }} {{ len (timestamp \"2006-01-02\") }}",
        "20 10",
    ),
    (
        "toJSON",
        "{{ toJSON (parseJSON `{\"a\":\"<b>\"}`) }}",
        "{\"a\":\"\\u003cb\\u003e\"}",
    ),
    (
        "toJSONPretty",
        "{{ toJSONPretty (parseJSON `{\"a\":1}`) }}",
        "{\n  \"a\": 1\n}",
    ),
    (
        "toUnescapedJSON",
        "{{ toUnescapedJSON (parseJSON `{\"a\":\"<b>\"}`) }}",
        "{\"a\":\"<b>\"}",
    ),
    (
        "toUnescapedJSONPretty",
        "{{ toUnescapedJSONPretty (split \",\" \"<\") }}",
        "[\n  \"<\"\n]",
    ),
    ("toLower", "{{ toLower \"AbC\" }}", "abc"),
    ("toTitle", "{{ toTitle \"hello world\" }}", "Hello World"),
    ("toUpper", "{{ toUpper \"abc\" }}", "ABC"),
    ("trimSpace", "{{ trimSpace \"  a \" }}", "a"),
    ("trim", "{{ trim \"xxaxx\" \"x\" }}", "a"),
    ("trimPrefix", "{{ trimPrefix \"ab\" \"abc\" }}", "c"),
    ("trimSuffix", "{{ \"abc\" | trimSuffix \"bc\" }}", "a"),
    ("add", "{{ add 1 2 }}", "3"),
    ("subtract", "{{ 5 | subtract 2 }}", "3"),
    ("multiply", "{{ multiply 2 1.5 }}", "3"),
    (
        "divide",
        "{{ 10 | divide 4 }} {{ 10.0 | divide 4 }}",
        "2 2.5",
    ),
    ("modulo", "{{ 10 | modulo 4 }}", "2"),
    ("minimum", "{{ minimum 3 2 }}", "2"),
    ("maximum", "{{ maximum 3 2 }}", "3"),
    ("sprig_atoi", "{{ sprig_atoi \"12\" }}", "12"),
    ("sprig_b64dec", "{{ sprig_b64dec \"aGk=\" }}", "hi"),
    ("sprig_b64enc", "{{ sprig_b64enc \"hi\" }}", "aGk="),
    ("sprig_coalesce", "{{ sprig_coalesce \"\" 0 \"x\" }}", "x"),
    (
        "sprig_contains",
        "{{ sprig_contains \"b\" \"abc\" }}",
        "true",
    ),
    (
        "sprig_default",
        "{{ \"\" | sprig_default \"d\" }} {{ \"v\" | sprig_default \"d\" }}",
        "d v",
    ),
    ("sprig_dict", "{{ (sprig_dict \"a\" 1).a }}", "1"),
    ("sprig_empty", "{{ sprig_empty \"\" }}", "true"),
    ("sprig_first", "{{ sprig_first (sprig_list 1 2) }}", "1"),
    ("sprig_has", "{{ sprig_has 2 (sprig_list 1 2) }}", "true"),
    (
        "sprig_hasPrefix",
        "{{ sprig_hasPrefix \"a\" \"abc\" }}",
        "true",
    ),
    (
        "sprig_hasSuffix",
        "{{ sprig_hasSuffix \"c\" \"abc\" }}",
        "true",
    ),
    (
        "sprig_join",
        "{{ sprig_join \"-\" (sprig_list 1 2) }}",
        "1-2",
    ),
    ("sprig_last", "{{ sprig_last (sprig_list 1 2) }}", "2"),
    ("sprig_list", "{{ sprig_list 1 \"a\" }}", "[1 a]"),
    ("sprig_lower", "{{ sprig_lower \"A\" }}", "a"),
    ("sprig_quote", "{{ sprig_quote \"a\" 1 }}", "\"a\" \"1\""),
    ("sprig_repeat", "{{ sprig_repeat 3 \"ab\" }}", "ababab"),
    (
        "sprig_replace",
        "{{ sprig_replace \"a\" \"b\" \"aa\" }}",
        "bb",
    ),
    (
        "sprig_sha256sum",
        "{{ sprig_sha256sum \"\" }}",
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    ),
    (
        "sprig_sortAlpha",
        "{{ sprig_sortAlpha (sprig_list \"b\" \"a\") }}",
        "[a b]",
    ),
    ("sprig_split", "{{ sprig_split \",\" \"a,b\" }}", "[a b]"),
    ("sprig_squote", "{{ sprig_squote \"a\" }}", "'a'"),
    ("sprig_ternary", "{{ sprig_ternary \"y\" \"n\" true }}", "y"),
    ("sprig_toString", "{{ sprig_toString 12 }}", "12"),
    ("sprig_trim", "{{ sprig_trim \" a \" }}", "a"),
    ("sprig_trimAll", "{{ sprig_trimAll \"$\" \"$5$\" }}", "5"),
    ("sprig_uniq", "{{ sprig_uniq (sprig_list 1 1 2) }}", "[1 2]"),
    ("sprig_upper", "{{ sprig_upper \"a\" }}", "A"),
];

#[test]
fn every_function_berth_computes_renders() {
    let computed: BTreeSet<&str> = FUNCTIONS
        .iter()
        .filter(|(name, support)| {
            matches!(support, Support::Yes | Support::Builtin) || *name == "envOrDefault"
        })
        .map(|(name, _)| *name)
        .collect();
    let cased: BTreeSet<&str> = CASES.iter().map(|(name, _, _)| *name).collect();
    let untested: Vec<&&str> = computed.difference(&cased).collect();
    assert!(
        untested.is_empty(),
        "functions without a rendering case: {untested:?}"
    );
    for (name, text, expected) in CASES {
        let template = Template::parse(text, &Delimiters::default())
            .unwrap_or_else(|e| panic!("{name}: {text:?}: {e}"));
        assert!(
            template.functions().contains(name),
            "{name}: {text:?} does not call it"
        );
        let rendered = template
            .render(&mut NoData, &RenderOptions::default())
            .unwrap_or_else(|e| panic!("{name}: {text:?}: {e}"));
        assert_eq!(&rendered, expected, "{name}: {text:?}");
    }
}

#[test]
fn the_docs_table_is_the_functions_table() {
    let docs = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/templates.md"
    ))
    .unwrap();
    let mut documented: BTreeMap<String, String> = BTreeMap::new();
    let table = docs
        .split_once("## The function table")
        .map_or("", |(_, table)| table);
    for line in table.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if let [_, name, answer, ..] = cells.as_slice()
            && let Some(name) = name.strip_prefix('`').and_then(|n| n.strip_suffix('`'))
        {
            documented.insert(name.to_string(), answer.to_string());
        }
    }
    let expected: BTreeMap<String, String> = FUNCTIONS
        .iter()
        .map(|(name, support)| {
            let answer = match support {
                Support::Builtin | Support::Yes | Support::Data => "yes".to_string(),
                Support::No(reason) => format!("no: {reason}"),
            };
            (name.to_string(), answer)
        })
        .collect();
    assert_eq!(
        documented, expected,
        "docs/templates.md's table differs from FUNCTIONS"
    );
}

/// Key trees from Consul are written by whoever may write keys: a path deeper than
/// made maps may nest, or a key that is both a value and a folder, ends the render with
/// its reason.
#[test]
fn key_trees_too_deep_or_clashing_are_refused() {
    let render = |json: &str| {
        let text = format!("{{{{ parseJSON `{json}` | explodeMap }}}}");
        Template::parse(&text, &Delimiters::default())
            .unwrap()
            .render(&mut NoData, &RenderOptions::default())
            .unwrap_err()
            .to_string()
    };
    let deep = vec!["a"; 10_000].join("/");
    let error = render(&format!("{{\"{deep}\":\"1\"}}"));
    assert!(
        error.contains("has 10000 parts: maps nest at most 32 deep"),
        "{error}"
    );
    let error = render("{\"a\":\"1\",\"a/b\":\"2\"}");
    assert!(
        error.contains("key \"a/b\" is both a value and a folder of other keys"),
        "{error}"
    );
}
