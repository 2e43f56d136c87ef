//! Go's formatting where templates meet it: `printf`'s verbs, and `timestamp`'s
//! reference-time layouts (`2006-01-02T15:04:05Z07:00`) turned into chrono's.

use crate::CallError;
use crate::value::{Value, go_float};

/// The most digits `%.Nf` may ask for.
const MAX_PRECISION: usize = 1000;

/// Go's `fmt.Sprintf` for the verbs templates use: `%v %s %d %q %f %F %e %g %x %X %o
/// %b %t %c %%`, with flags `-+ 0#`, width and precision (`*` not). A verb that does
/// not fit its operand writes Go's `%!d(string=x)`; a missing operand `%!d(MISSING)`.
pub fn printf(format: &str, args: &[Value], max: usize) -> Result<String, CallError> {
    let mut out = String::new();
    let mut next = 0usize;
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if out.len() > max {
            return Err(format!("the result would pass {max} bytes").into());
        }
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut flags = String::new();
        while let Some(&f) = chars.peek() {
            if "-+ 0#".contains(f) {
                flags.push(f);
                chars.next();
            } else {
                break;
            }
        }
        let number = |chars: &mut std::iter::Peekable<std::str::Chars>| {
            let mut n: Option<usize> = None;
            while let Some(d) = chars.peek().and_then(|c| c.to_digit(10)) {
                n = Some(n.unwrap_or(0).saturating_mul(10).saturating_add(d as usize));
                chars.next();
            }
            n
        };
        let width = number(&mut chars);
        let precision = if chars.peek() == Some(&'.') {
            chars.next();
            Some(number(&mut chars).unwrap_or(0))
        } else {
            None
        };
        if width.unwrap_or(0) > max {
            return Err(format!("a width past {max}").into());
        }
        // Rust's formatter refuses more than 65,535 digits; nobody needs a thousand.
        if precision.unwrap_or(0) > MAX_PRECISION {
            return Err(format!("a precision past {MAX_PRECISION}").into());
        }
        let Some(verb) = chars.next() else {
            out.push_str("%!(NOVERB)");
            break;
        };
        if verb == '%' {
            out.push('%');
            continue;
        }
        let Some(arg) = args.get(next) else {
            out.push_str(&format!("%!{verb}(MISSING)"));
            continue;
        };
        next += 1;
        let body = match verb_text(verb, arg, &flags, precision) {
            Some(body) => body,
            None => {
                out.push_str(&format!(
                    "%!{verb}({}={})",
                    arg.type_name(),
                    arg.to_go_string()
                ));
                continue;
            }
        };
        let width = width.unwrap_or(0);
        let len = body.chars().count();
        if len >= width {
            out.push_str(&body);
        } else if flags.contains('-') {
            out.push_str(&body);
            out.push_str(&" ".repeat(width - len));
        } else if flags.contains('0')
            && matches!(arg, Value::Int(_) | Value::Float(_))
            && verb != 's'
        {
            let (sign, digits) = match body.strip_prefix(['-', '+']) {
                Some(rest) => (&body[..1], rest),
                None => ("", body.as_str()),
            };
            out.push_str(sign);
            out.push_str(&"0".repeat(width - len));
            out.push_str(digits);
        } else {
            out.push_str(&" ".repeat(width - len));
            out.push_str(&body);
        }
    }
    if next < args.len() {
        out.push_str("%!(EXTRA ");
        for (i, arg) in args[next..].iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            out.push_str(arg.type_name());
            out.push('=');
            arg.write_go(&mut out);
            if out.len() > max {
                return Err(format!("the result would pass {max} bytes").into());
            }
        }
        out.push(')');
    }
    if out.len() > max {
        return Err(format!("the result would pass {max} bytes").into());
    }
    Ok(out)
}

fn signed(flags: &str, text: String, negative: bool) -> String {
    if negative {
        text
    } else if flags.contains('+') {
        format!("+{text}")
    } else if flags.contains(' ') {
        format!(" {text}")
    } else {
        text
    }
}

fn verb_text(verb: char, arg: &Value, flags: &str, precision: Option<usize>) -> Option<String> {
    let float = |f: f64| -> Option<String> {
        let text = match verb {
            'f' | 'F' => format!("{:.*}", precision.unwrap_or(6), f),
            'e' => exponent(f, precision.unwrap_or(6)),
            'g' | 'v' => match precision {
                Some(p) => format!("{:.*}", p, f),
                None => go_float(f),
            },
            _ => return None,
        };
        Some(signed(flags, text, f.is_sign_negative()))
    };
    match (verb, arg) {
        ('v', Value::Float(f)) => float(*f),
        ('v', other) => Some(other.to_go_string()),
        ('s', Value::Str(s)) => Some(match precision {
            Some(p) => s.chars().take(p).collect(),
            None => s.to_string(),
        }),
        ('s', Value::List(_) | Value::Map(_) | Value::Ints { .. }) => Some(arg.to_go_string()),
        ('q', Value::Str(s)) => Some(format!("{s:?}")),
        ('q', Value::Int(i)) => char::from_u32(u32::try_from(*i).ok()?).map(|c| format!("{c:?}")),
        ('d', Value::Int(i)) => Some(signed(flags, i.to_string(), *i < 0)),
        ('x', Value::Int(i)) => Some(radix(*i, 16, flags, "0x", false)),
        ('X', Value::Int(i)) => Some(radix(*i, 16, flags, "0X", true)),
        ('o', Value::Int(i)) => Some(radix(*i, 8, flags, "0", false)),
        ('b', Value::Int(i)) => Some(radix(*i, 2, flags, "", false)),
        ('x', Value::Str(s)) => Some(s.bytes().map(|b| format!("{b:02x}")).collect()),
        ('X', Value::Str(s)) => Some(s.bytes().map(|b| format!("{b:02X}")).collect()),
        ('c', Value::Int(i)) => char::from_u32(u32::try_from(*i).ok()?).map(String::from),
        ('t', Value::Bool(b)) => Some(b.to_string()),
        ('f' | 'F' | 'e' | 'g', Value::Float(f)) => float(*f),
        ('f' | 'F' | 'e' | 'g', Value::Int(_)) => None,
        _ => None,
    }
}

fn radix(i: i64, base: u32, flags: &str, prefix: &str, upper: bool) -> String {
    let magnitude = i.unsigned_abs();
    let digits = match base {
        16 if upper => format!("{magnitude:X}"),
        16 => format!("{magnitude:x}"),
        8 => format!("{magnitude:o}"),
        _ => format!("{magnitude:b}"),
    };
    let prefix = if flags.contains('#') { prefix } else { "" };
    let sign = if i < 0 { "-" } else { "" };
    format!("{sign}{prefix}{digits}")
}

/// Go's `%e`: `1.500000e+00`.
fn exponent(f: f64, precision: usize) -> String {
    let text = format!("{:.*e}", precision, f);
    let (mantissa, exp) = text.split_once('e').unwrap_or((&text, "0"));
    let (sign, digits) = match exp.strip_prefix('-') {
        Some(d) => ('-', d),
        None => ('+', exp),
    };
    format!("{mantissa}e{sign}{digits:0>2}")
}

/// A Go time layout (the reference time `Mon Jan 2 15:04:05 MST 2006` written as the
/// output should look) as a chrono format string.
pub fn go_layout(layout: &str) -> String {
    // Longest first, so that `2006` is not read as `2` and `06`.
    const PARTS: &[(&str, &str)] = &[
        ("January", "%B"),
        ("Monday", "%A"),
        ("Z07:00", "%:z"),
        ("-07:00", "%:z"),
        ("-0700", "%z"),
        (".000000000", "%.9f"),
        (".000000", "%.6f"),
        (".000", "%.3f"),
        ("2006", "%Y"),
        ("Jan", "%b"),
        ("Mon", "%a"),
        ("MST", "%Z"),
        ("002", "%j"),
        ("-07", "%:::z"),
        ("01", "%m"),
        ("02", "%d"),
        ("_2", "%e"),
        ("03", "%I"),
        ("04", "%M"),
        ("05", "%S"),
        ("06", "%y"),
        ("15", "%H"),
        ("PM", "%p"),
        ("pm", "%P"),
        ("1", "%-m"),
        ("2", "%-d"),
        ("3", "%-I"),
        ("4", "%-M"),
        ("5", "%-S"),
    ];
    let mut out = String::new();
    let mut rest = layout;
    'outer: while let Some(c) = rest.chars().next() {
        for (go, chrono) in PARTS {
            if let Some(after) = rest.strip_prefix(go) {
                // `Z07:00` writes Z for UTC, as the clock here is.
                if *go == "Z07:00" {
                    out.push('Z');
                } else {
                    out.push_str(chrono);
                }
                rest = after;
                continue 'outer;
            }
        }
        if c == '%' {
            out.push_str("%%");
        } else {
            out.push(c);
        }
        rest = &rest[c.len_utf8()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(format: &str, args: &[Value]) -> String {
        printf(format, args, 1 << 20).unwrap()
    }

    #[test]
    fn printf_writes_what_go_writes() {
        assert_eq!(f("%s=%d", &[Value::str("a"), Value::Int(-3)]), "a=-3");
        assert_eq!(
            f(
                "%05d|%-4s|%4s|",
                &[Value::Int(42), Value::str("ab"), Value::str("cd")]
            ),
            "00042|ab  |  cd|"
        );
        assert_eq!(
            f(
                "%.2f %v %x %#x %q",
                &[
                    Value::Float(2.71628),
                    Value::Float(2.0),
                    Value::Int(255),
                    Value::Int(255),
                    Value::str("hi\n")
                ]
            ),
            "2.72 2 ff 0xff \"hi\\n\""
        );
        assert_eq!(f("%d", &[Value::str("x")]), "%!d(string=x)");
        assert_eq!(f("%s %s", &[Value::str("x")]), "x %!s(MISSING)");
        assert_eq!(
            f("%s", &[Value::str("x"), Value::Int(1)]),
            "x%!(EXTRA int=1)"
        );
        assert_eq!(
            f(
                "%e|%t|%c|%%",
                &[Value::Float(1500.0), Value::Bool(true), Value::Int(65)]
            ),
            "1.500000e+03|true|A|%"
        );
    }

    #[test]
    fn a_huge_width_is_refused() {
        assert!(printf("%99999999999d", &[Value::Int(1)], 1 << 20).is_err());
    }

    #[test]
    fn go_layouts_become_chrono_formats() {
        assert_eq!(go_layout("2006-01-02T15:04:05Z07:00"), "%Y-%m-%dT%H:%M:%SZ");
        assert_eq!(
            go_layout("Jan _2 15:04:05.000 MST %"),
            "%b %e %H:%M:%S%.3f %Z %%"
        );
        assert_eq!(
            go_layout("Monday, January 2 2006 3:04PM -0700"),
            "%A, %B %-d %Y %-I:%M%p %z"
        );
    }
}
