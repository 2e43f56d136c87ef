//! A template of 100 lines with a `range` over 1,000 services (Nomad's `nomadService`
//! shape: address, port, tags), rendered by berth's consul-template engine, next to
//! the same text written by hand-made Rust (`write!` per line: the floor any renderer
//! has), interleaved in the same run. The bound: ≤ 500 µs per render (release).
//!
//! `cargo bench -p berth --bench template_render`
//!
//! It ends with `summary: name = value` lines, one figure each (`common::summary`).

mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use berth_template::{CallError, Data, Delimiters, RenderOptions, Template, Value};
use common::{median, micros, ratio, summary};

const SERVICES: usize = 1_000;

struct Catalog {
    services: Value,
    env: BTreeMap<String, String>,
}

impl Data for Catalog {
    fn call(&mut self, function: &str, args: &[Value]) -> Result<Value, CallError> {
        match (function, args) {
            ("nomadService", [Value::Str(_)]) => Ok(self.services.clone()),
            ("env", [Value::Str(name)]) => Ok(Value::str(
                self.env.get(&**name).cloned().unwrap_or_default(),
            )),
            _ => Err(CallError(format!("no {function} here"))),
        }
    }
}

struct Service {
    address: String,
    port: u16,
    primary: bool,
}

fn services() -> Vec<Service> {
    (0..SERVICES)
        .map(|i| Service {
            address: format!("10.0.{}.{}", i / 250, i % 250),
            port: 20_000 + i as u16,
            primary: i % 10 == 0,
        })
        .collect()
}

/// Two lines of header, 94 of settings and the range in 4: 100 lines in all.
fn template_text() -> String {
    let mut text = String::from("# generated for {{ env \"NOMAD_ALLOC_ID\" }}\nglobal\n");
    for i in 0..47 {
        let _ = writeln!(text, "  setting_{i} {{{{ env \"SETTING\" }}}}-{i}");
        let _ = writeln!(text, "  static_{i} value-{i}");
    }
    text.push_str("backend api\n{{- range $i, $s := nomadService \"api\" }}\n  server api{{ $i }} {{ $s.Address }}:{{ $s.Port }}{{ if in $s.Tags \"primary\" }} weight 10{{ end }}\n{{- end }}\n");
    text
}

/// What the template renders, written by hand.
fn by_hand(services: &[Service], alloc: &str, setting: &str) -> String {
    let mut out = String::with_capacity(64 * SERVICES);
    let _ = write!(out, "# generated for {alloc}\nglobal\n");
    for i in 0..47 {
        let _ = writeln!(out, "  setting_{i} {setting}-{i}");
        let _ = writeln!(out, "  static_{i} value-{i}");
    }
    out.push_str("backend api");
    for (i, s) in services.iter().enumerate() {
        let _ = write!(out, "\n  server api{i} {}:{}", s.address, s.port);
        if s.primary {
            out.push_str(" weight 10");
        }
    }
    out.push('\n');
    out
}

fn main() {
    let runs = common::sized(400, 20);
    let plain = services();
    let records: Vec<Value> = plain
        .iter()
        .map(|s| {
            let tags = if s.primary {
                vec![Value::str("primary"), Value::str("v1")]
            } else {
                vec![Value::str("v1")]
            };
            Value::object(
                "service",
                BTreeMap::from([
                    ("Address", Value::str(s.address.clone())),
                    ("Port", Value::Int(i64::from(s.port))),
                    ("Tags", Value::list(tags)),
                    ("Name", Value::str("api")),
                ]),
            )
        })
        .collect();
    let mut catalog = Catalog {
        services: Value::list(records),
        env: BTreeMap::from([
            ("NOMAD_ALLOC_ID".to_string(), "5f1c".to_string()),
            ("SETTING".to_string(), "on".to_string()),
        ]),
    };
    let text = template_text();
    assert_eq!(text.lines().count(), 100, "{text}");
    let template = Template::parse(&text, &Delimiters::default()).unwrap();
    let options = RenderOptions::default();
    let expected = by_hand(&plain, "5f1c", "on");
    assert_eq!(template.render(&mut catalog, &options).unwrap(), expected);
    let mut berth = Vec::with_capacity(runs);
    let mut baseline = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        let rendered = template.render(&mut catalog, &options).unwrap();
        berth.push(started.elapsed());
        std::hint::black_box(rendered);
        let started = Instant::now();
        let written = by_hand(&plain, "5f1c", "on");
        baseline.push(started.elapsed());
        std::hint::black_box(written);
    }
    let (berth, baseline): (Duration, Duration) = (median(berth), median(baseline));
    println!(
        "a 100-line template over {SERVICES} services: berth {:.1} µs, by hand {:.1} µs (median of {runs})",
        micros(berth),
        micros(baseline)
    );
    if !cfg!(debug_assertions) {
        assert!(
            berth <= Duration::from_micros(500),
            "the render took {berth:?}, over the 500 µs bound"
        );
    }
    summary("template_render_us", micros(berth));
    summary("template_by_hand_us", micros(baseline));
    summary("template_render_over_by_hand", ratio(berth, baseline));
}
