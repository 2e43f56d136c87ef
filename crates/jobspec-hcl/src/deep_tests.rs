//! Hostile depth and cost: jobspecs that nest past the bound, or ask for more work than
//! the budget allows, are refused with an error that names the bound, and the process
//! that evaluates them stays up (a stack overflow would abort this test binary).

use proptest::prelude::*;

use super::*;

/// `meta { x = [[1]][*][*]…[*] }` inside a job: the 9 KB jobspec that aborted the
/// agent at 2,200 splats.
fn splats(count: usize) -> String {
    format!(
        "job \"deep\" {{\n  meta {{\n    x = [[1]]{}\n  }}\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"mock\"\n    }}\n  }}\n}}\n",
        "[*]".repeat(count)
    )
}

fn names_the_bound(error: &JobspecError) -> bool {
    error.problems.iter().any(|p| {
        p.message.contains("berth allows 128")
            || p.message.contains("at most 64 nested levels")
            || p.message.contains("at most 128 chained binary operators")
    })
}

#[test]
fn three_thousand_splats_are_refused_at_their_line() {
    let error = parse("deep.hcl", &splats(3000)).unwrap_err();
    assert_eq!(error.problems.len(), 1, "{error}");
    let problem = &error.problems[0];
    assert_eq!(problem.at.map(|at| at.line), Some(3), "{error}");
    assert!(
        problem.message.contains("nested more than 128 levels deep"),
        "{error}"
    );
    // Up to the bound the chain is evaluated (on the evaluating threads' stacks): 2
    // blocks, the traversal, 122 splats, `[[1]]`.
    for count in [3, 122] {
        if let Err(error) = parse("fits.hcl", &splats(count)) {
            assert!(!names_the_bound(&error), "{count}: {error}");
        }
    }
    assert!(names_the_bound(
        &parse("past.hcl", &splats(123)).unwrap_err()
    ));
}

#[test]
fn deep_values_of_variables_are_refused_too() {
    let source = "variable \"v\" {\n  type = list(any)\n}\njob \"j\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"mock\"\n    }\n  }\n}\n";
    let deep = format!("[[1]]{}", "[*]".repeat(3000));
    let from_arg = berth_hcl::eval::VariableInputs {
        args: vec![("v".into(), deep.clone())],
        ..Default::default()
    };
    let error = parse_with("j.hcl", source, &from_arg).unwrap_err();
    assert!(names_the_bound(&error), "{error}");
    let from_file = berth_hcl::eval::VariableInputs {
        files: vec![("deep.vars".into(), format!("v = {deep}\n"))],
        ..Default::default()
    };
    let error = parse_with("j.hcl", source, &from_file).unwrap_err();
    assert!(names_the_bound(&error), "{error}");
}

/// The other jobspec: `length(distinct(L))` of 1,024 lists that differ only at
/// their ends, compared pairwise before anything was charged. Hashed, it is linear.
#[test]
fn distinct_of_large_lists_is_linear() {
    let inner = vec!["1"; 1000].join(",");
    let lists: Vec<String> = (0..1024).map(|i| format!("[{inner},{i}]")).collect();
    let source = format!(
        "job \"d\" {{\n  meta {{\n    n = length(distinct([{}]))\n  }}\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"mock\"\n    }}\n  }}\n}}\n",
        lists.join(",")
    );
    assert!(source.len() > 2_000_000);
    let started = std::time::Instant::now();
    let outcome = parse("distinct.hcl", &source);
    let took = started.elapsed();
    // The result is as large as the list: past the memory budget, refused as such
    // (before it is built), without an expression of 2 MB in the message. An unoptimised
    // build on a slow machine may spend its 2 s of CPU first (CI did, at 2.5 s for the
    // whole test): either budget is a refusal that names itself.
    let error = outcome.unwrap_err();
    assert_eq!(error.problems.len(), 1, "{error}");
    let message = &error.problems[0].message;
    assert!(
        message.contains("berth allows 16 MiB") || message.contains("berth allows 2 s"),
        "{error}"
    );
    assert!(error.to_string().len() < 1000, "{error}");
    // 1,024 lists of 100 differ at their ends: distinct keeps all of them (of 300, a
    // loaded debug build ran past the 2 s CPU budget).
    let small = vec!["1"; 100].join(",");
    let lists: Vec<String> = (0..1024).map(|i| format!("[{small},{i}]")).collect();
    let source = format!(
        "job \"d\" {{\n  meta {{\n    n = length(distinct([{}]))\n  }}\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"mock\"\n    }}\n  }}\n}}\n",
        lists.join(",")
    );
    let job = parse("distinct.hcl", &source).unwrap();
    assert_eq!(job.meta, [("n".to_string(), "1024".to_string())]);
    eprintln!("length(distinct(L)) of a 2 MB L: {took:?}");
    // Pairwise (the old code) this took minutes in a debug build.
    assert!(took < std::time::Duration::from_secs(20), "{took:?}");
}

#[test]
fn a_budget_hit_names_its_budget_and_the_next_jobspec_is_evaluated() {
    // `contains` over a 45 KB local, once for each of 1,024 elements: 45 MiB of copies.
    let big = format!(
        "[{}]",
        vec!["\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\""; 1000].join(",")
    );
    let source = format!(
        "locals {{\n  big = {big}\n}}\njob \"b\" {{\n  meta {{\n    x = jsonencode([for i in range(1024) : contains(local.big, i)])\n  }}\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"mock\"\n    }}\n  }}\n}}\n"
    );
    let error = parse("budget.hcl", &source).unwrap_err();
    assert!(
        error
            .problems
            .iter()
            .any(|p| p.message.contains("berth allows 16 MiB")),
        "{error}"
    );
    // Reported once, not once per expression that followed.
    assert_eq!(error.problems.len(), 1, "{error}");
    parse(
        "next.hcl",
        "job \"n\" {\n  group \"g\" {\n    task \"t\" {\n      driver = \"mock\"\n    }\n  }\n}\n",
    )
    .unwrap();
}

/// A chain of `depth` openers of `kind` around a value (closed unless `open`).
fn chain(kind: usize, depth: usize, open: bool) -> String {
    let (opener, inner, closer) = match kind {
        0 => ("(", "1", ")"),
        1 => ("[", "1", "]"),
        2 => ("", "[[1]]", "[*]"),
        3 => ("{a = ", "1", "}"),
        4 => ("upper(", "\"x\"", ")"),
        5 => ("\"${", "1", "}\""),
        6 => ("", "var.v", ".a"),
        7 => ("", "1", " + 1"),
        8 => ("!", "true", ""),
        _ => ("-", "1", ""),
    };
    let mut text = String::with_capacity((opener.len() + closer.len()) * depth + inner.len());
    for _ in 0..depth {
        text.push_str(opener);
    }
    text.push_str(inner);
    if !open {
        for _ in 0..depth {
            text.push_str(closer);
        }
    }
    text
}

/// Where the chain stands in a jobspec: a job's meta, a local, a variable's default,
/// a task's config (which keeps run-time templates), a var file's value.
fn placed(place: usize, value: &str) -> (String, berth_hcl::eval::VariableInputs) {
    let task = "group \"g\" {\n    task \"t\" {\n      driver = \"mock\"\n    }\n  }";
    let mut inputs = berth_hcl::eval::VariableInputs::default();
    let source = match place {
        0 => format!("job \"p\" {{\n  meta {{\n    x = {value}\n  }}\n  {task}\n}}\n"),
        1 => format!("locals {{\n  x = {value}\n}}\njob \"p\" {{\n  {task}\n}}\n"),
        2 => format!("variable \"x\" {{\n  default = {value}\n}}\njob \"p\" {{\n  {task}\n}}\n"),
        3 => format!(
            "job \"p\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"mock\"\n      config {{\n        x = {value}\n      }}\n    }}\n  }}\n}}\n"
        ),
        _ => {
            inputs.files = vec![("fuzz.vars".into(), format!("x = {value}\n"))];
            format!("variable \"x\" {{}}\njob \"p\" {{\n  {task}\n}}\n")
        }
    };
    (source, inputs)
}

fn depths() -> impl Strategy<Value = usize> {
    prop_oneof![
        1usize..200,
        200usize..5_000,
        // Up to about 1 MB of openers.
        5_000usize..330_000,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Nested `(`, `[`, `[*]`, `{`, `f(`, `${`, `.a`, `+`, `!` and `-` chains, up to
    /// 1 MB, closed or not, in every place a jobspec has values: never a crash, and deep
    /// input gets the nesting error, at a line.
    #[test]
    fn nesting_never_crashes_the_parser(
        kind in 0usize..10,
        depth in depths(),
        open in prop::bool::weighted(0.2),
        place in 0usize..5,
    ) {
        let (source, inputs) = placed(place, &chain(kind, depth, open));
        let outcome = parse_with("fuzz.hcl", &source, &inputs);
        if let Err(error) = &outcome {
            prop_assert!(!error.problems.is_empty());
        }
        if depth > MAX_DEPTH_ALLOWED && !open {
            let error = outcome.expect_err("deep input is refused");
            prop_assert!(names_the_bound(&error), "{}", error);
            if place != 4 {
                prop_assert!(
                    error.problems.iter().all(|p| p.at.is_some_and(|at| at.line >= 1)),
                    "{}",
                    error
                );
            }
        }
    }
}

/// Above this many levels every chain kind is past one bound or the other (the parser's
/// 64 nested levels, or berth's 128).
const MAX_DEPTH_ALLOWED: usize = 128;
