//! The function library's own tests: each function on good and hostile input, and its
//! bounds.

use super::*;
use hcl::eval::Evaluate;

fn eval(source: &str) -> std::result::Result<Value, String> {
    let mut ctx = Context::new();
    declare_all(&mut ctx);
    let expr: hcl::Expression = source.parse().map_err(|e| format!("{e}"))?;
    expr.evaluate(&ctx).map_err(|e| e.to_string())
}

#[test]
fn strings() {
    assert_eq!(eval(r#"upper("web")"#), Ok("WEB".into()));
    assert_eq!(
        eval(r#"title("hello big world")"#),
        Ok("Hello Big World".into())
    );
    assert_eq!(
        eval(r#"format("%s-%03d %.1f %t %q", "a", 7, 2.25, true, "x")"#),
        Ok("a-007 2.2 true \"x\"".into())
    );
    assert_eq!(eval(r#"join(",", ["a", "b"], ["c"])"#), Ok("a,b,c".into()));
    assert_eq!(eval(r#"substr("hello", 1, 3)"#), Ok("ell".into()));
    assert_eq!(eval(r#"replace("a-b-c", "-", "+")"#), Ok("a+b+c".into()));
    assert_eq!(
        eval(r#"base64decode(base64encode("berth"))"#),
        Ok("berth".into())
    );
    assert_eq!(
        eval(r#"jsonencode({a = [1, "x"]})"#),
        Ok(r#"{"a":[1,"x"]}"#.into())
    );
    assert_eq!(eval(r#"coalesce("", "b")"#), Ok("b".into()));
}

#[test]
fn collections() {
    assert_eq!(
        eval(r#"length(split(",", "a,b,c"))"#),
        Ok(Value::from(3u64))
    );
    assert_eq!(
        eval(r#"concat([1], [2, 3])"#),
        Ok(Value::from_iter([1, 2, 3]))
    );
    assert_eq!(
        eval(r#"lookup(merge({a = 1}, {a = 2, b = 3}), "a", 0)"#),
        Ok(Value::from(2))
    );
    assert_eq!(eval(r#"lookup({}, "a", "dflt")"#), Ok("dflt".into()));
    assert_eq!(eval("range(3)"), Ok(Value::from_iter([0, 1, 2])));
    assert_eq!(eval("range(1, 7, 2)"), Ok(Value::from_iter([1, 3, 5])));
    assert_eq!(
        eval(r#"distinct(["a", "b", "a"])"#),
        Ok(Value::from_iter(["a", "b"]))
    );
    assert_eq!(
        eval("flatten([[1], [2, [3]]])"),
        Ok(Value::from_iter([1, 2, 3]))
    );
    assert_eq!(eval("max(3, 9, 4)"), Ok(Value::from(9)));
}

#[test]
fn every_listed_name_is_declared_and_only_file_is_the_clis() {
    let mut ctx = Context::new();
    declare_all(&mut ctx);
    for name in NAMES {
        let expr: hcl::Expression = format!("{name}()").parse().unwrap();
        let undefined = matches!(
            expr.evaluate(&ctx).map_err(|e| e.kind().clone()),
            Err(hcl::eval::ErrorKind::UndefinedFunc(_))
        );
        assert_eq!(undefined, *name == "file", "{name}");
    }
}

#[test]
fn every_result_is_bounded() {
    let too_many = eval("range(100000)").unwrap_err();
    assert!(too_many.contains("berth allows 1024"), "{too_many}");
    let too_long = eval(r#"format("%60000s%60000s", "x", "y")"#)
        .map(|v| v.to_string().len())
        .unwrap_err();
    assert!(too_long.contains("berth allows 65536"), "{too_long}");
    // 60,000 matches of a 60,000-byte replacement: 3.6 GB, refused by its length.
    let (many, long) = ("a".repeat(60_000), "b".repeat(60_000));
    let refused = eval(&format!(r#"replace("{many}", "a", "{long}")"#)).unwrap_err();
    assert!(
        refused.contains("the result would be 3600000000 bytes long; berth allows 65536"),
        "{refused}"
    );
    assert_eq!(eval(r#"replace("abc", "", "-")"#), Ok("-a-b-c-".into()));
    assert_eq!(eval(r#"replace("a.b.c", ".", "::")"#), Ok("a::b::c".into()));
    let list = format!("[{}]", vec!["1"; 2000].join(", "));
    let compared = eval(&format!("distinct({list})")).unwrap_err();
    assert!(
        compared.contains("berth compares at most 1024"),
        "{compared}"
    );
    let joined = eval(&format!(
        r#"join("", [{}])"#,
        vec![format!("{:?}", "x".repeat(40_000)); 2].join(", ")
    ))
    .unwrap_err();
    assert!(joined.contains("80000 bytes long"), "{joined}");
    let never = eval("range(0, 5, -1)").unwrap_err();
    assert!(never.contains("never ends"), "{never}");
    assert!(eval(r#"jsondecode("{")"#).unwrap_err().contains("not JSON"));
}
