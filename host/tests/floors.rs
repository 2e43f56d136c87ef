//! The invariants ARCHITECTURE.md states about the code, checked on the syntax tree of
//! the product crates' source (`host/src`, `crates/*/src`, parsed with `syn`), in the
//! spirit of rust-analyzer's tidy tests.
//! Comments and strings are not code; `use` trees (nested groups too), `super::` chains
//! and paths in expressions and types are resolved to the module they name; the paths
//! inside macro calls count; and an `include!`d file is read as part of the module that
//! includes it. Every rule is one function that returns its violations, each naming the
//! file and line that broke it, and has a unit test below showing that it catches a
//! violation.
//!
//! The floors are read from ARCHITECTURE.md (the "Floors" block), so the picture there
//! and the rule here are the same thing.
//!
//! Known violations that a rule tolerates for now are on the allow-list (`ALLOWED`),
//! each with its reason. An entry that no longer matches anything fails the test, so
//! the list only shrinks.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proc_macro2::{Spacing, Span, TokenStream, TokenTree};
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{
    Attribute, Expr, GenericArgument, Item, ItemUse, Lit, Macro, PathArguments, Token, Type,
    TypeParamBound, TypePath, UseTree,
};

/// A broken rule: where, and which rule.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Violation {
    file: String,
    line: usize,
    /// What an allow-list entry matches (with the file): a name that stays when lines move.
    key: String,
    message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.message)
    }
}

/// One source file: its path relative to the repository and its text.
#[derive(Clone)]
struct Source {
    path: String,
    text: String,
}

// ---------------------------------------------------------------------------------------
// Reading the source: files, modules, names.

/// Which crate of the package a file belongs to: the library (`host/src/lib.rs` and its
/// modules) or the `berth` binary (`host/src/main.rs`), whose `crate::` is its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Krate {
    Lib,
    Bin,
}

fn krate_of(path: &str) -> Krate {
    if path == "host/src/main.rs" || path.starts_with("host/src/bin/") {
        Krate::Bin
    } else {
        Krate::Lib
    }
}

/// A file's module path in its crate, from its path as rustc derives it
/// (`host/src/csi/client.rs` is `csi::client`, `host/src/csi/mod.rs` is `csi`, the crate
/// roots are `[]`).
fn module_of(path: &str) -> Vec<String> {
    let rel = path.strip_prefix("host/src/").unwrap_or(path);
    // A crate of `crates/`: `crates/model/src/events.rs` is its crate's `events`.
    let rel = match rel.strip_prefix("crates/") {
        Some(in_crates) => in_crates.split_once("/src/").map_or(rel, |(_, rel)| rel),
        None => rel,
    };
    let rel = rel.strip_suffix(".rs").unwrap_or(rel);
    let mut segments: Vec<String> = rel.split('/').map(str::to_string).collect();
    if segments.last().is_some_and(|last| last == "mod") {
        segments.pop();
    }
    if segments.len() == 1 && matches!(segments[0].as_str(), "lib" | "main") {
        segments.clear();
    }
    segments
}

/// What a path names once `crate::`, `self::`, `super::` and the `use` declarations in
/// scope are taken into account.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    /// An item of this crate: its path from the crate root.
    Crate(Vec<String>),
    /// An item of another crate: the crate's name first.
    Extern(Vec<String>),
    /// A name the checker does not follow: a local type or variable, a generic, a name of
    /// the prelude.
    Local(Vec<String>),
    /// A `super::` chain that climbs above the crate root.
    AboveRoot,
}

impl Target {
    fn join(self, rest: &[String]) -> Target {
        let extend = |mut path: Vec<String>| {
            path.extend(rest.iter().cloned());
            path
        };
        match self {
            Target::Crate(path) => Target::Crate(extend(path)),
            Target::Extern(path) => Target::Extern(extend(path)),
            Target::Local(path) => Target::Local(extend(path)),
            Target::AboveRoot => Target::AboveRoot,
        }
    }

    /// The crate an extern path names.
    fn extern_crate(&self) -> Option<&str> {
        match self {
            Target::Extern(path) => path.first().map(String::as_str),
            _ => None,
        }
    }

    fn is_extern(&self, path: &[&str]) -> bool {
        matches!(self, Target::Extern(found) if found.iter().map(String::as_str).eq(path.iter().copied()))
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Crate(path) if path.is_empty() => write!(f, "crate"),
            Target::Crate(path) => write!(f, "crate::{}", path.join("::")),
            Target::Extern(path) | Target::Local(path) => write!(f, "{}", path.join("::")),
            Target::AboveRoot => write!(f, "super:: above the crate root"),
        }
    }
}

/// The names a module has: what it defines and what its `use` declarations bring in.
#[derive(Debug, Default)]
struct Scope {
    /// Items and child modules defined here.
    items: BTreeSet<String>,
    /// Child modules (in their own file or inline).
    children: BTreeSet<String>,
    /// Each name a `use` brings in, with the path as written (`use a::b as c` is `c` ->
    /// `a::b`). `use` declarations inside function bodies count for the whole module.
    aliases: BTreeMap<String, Vec<String>>,
    /// The paths of `use …::*` declarations, as written.
    globs: Vec<Vec<String>>,
}

/// Resolves paths as rustc does for the names the rules care about.
struct Resolver<'a> {
    scopes: &'a BTreeMap<Vec<String>, Scope>,
    externs: &'a BTreeSet<String>,
}

impl Resolver<'_> {
    fn resolve(&self, module: &[String], path: &[String]) -> Target {
        self.resolve_at(module, path, 0)
    }

    fn resolve_at(&self, module: &[String], path: &[String], depth: usize) -> Target {
        let Some(first) = path.first() else {
            return Target::Crate(module.to_vec());
        };
        match first.as_str() {
            "::" => Target::Extern(path[1..].to_vec()),
            "crate" | "$crate" => Target::Crate(path[1..].to_vec()),
            "self" | "super" => {
                let mut at = module.to_vec();
                let mut rest = path;
                if rest[0] == "self" {
                    rest = &rest[1..];
                }
                while rest.first().is_some_and(|segment| segment == "super") {
                    if at.pop().is_none() {
                        return Target::AboveRoot;
                    }
                    rest = &rest[1..];
                }
                Target::Crate(at).join(rest)
            }
            "Self" => Target::Local(path.to_vec()),
            name => match self.lookup(module, name, depth) {
                Some(found) => found.join(&path[1..]),
                None if self.externs.contains(name) => Target::Extern(path.to_vec()),
                None => Target::Local(path.to_vec()),
            },
        }
    }

    /// What `name` means in `module`: a `use`, an item of the module, or a name a glob
    /// import brings in.
    fn lookup(&self, module: &[String], name: &str, depth: usize) -> Option<Target> {
        if depth > 16 {
            return None;
        }
        let scope = self.scopes.get(module)?;
        if let Some(path) = scope.aliases.get(name) {
            // `use tonic;` names the crate itself.
            if !(path.len() == 1 && path[0] == name) {
                return Some(self.resolve_at(module, path, depth + 1));
            }
        }
        if scope.items.contains(name) {
            let mut path = module.to_vec();
            path.push(name.to_string());
            return Some(Target::Crate(path));
        }
        for glob in &scope.globs {
            if let Target::Crate(from) = self.resolve_at(module, glob, depth + 1)
                && let Some(found) = self.lookup(&from, name, depth + 1)
            {
                return Some(found);
            }
        }
        None
    }
}

/// One leaf of a `use` tree: the whole path, the name it brings in (`None` for a glob),
/// and its line.
struct UseLeaf {
    path: Vec<String>,
    alias: Option<String>,
    line: usize,
}

fn use_leaves(item: &ItemUse) -> Vec<UseLeaf> {
    fn walk(tree: &UseTree, prefix: &mut Vec<String>, out: &mut Vec<UseLeaf>) {
        match tree {
            UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                walk(&path.tree, prefix, out);
                prefix.pop();
            }
            UseTree::Name(name) => {
                let (path, alias) = if name.ident == "self" {
                    (prefix.clone(), prefix.last().cloned())
                } else {
                    let mut path = prefix.clone();
                    path.push(name.ident.to_string());
                    (path, Some(name.ident.to_string()))
                };
                out.push(UseLeaf {
                    path,
                    alias,
                    line: line(name.ident.span()),
                });
            }
            UseTree::Rename(rename) => {
                let mut path = prefix.clone();
                if rename.ident != "self" {
                    path.push(rename.ident.to_string());
                }
                out.push(UseLeaf {
                    path,
                    alias: Some(rename.rename.to_string()),
                    line: line(rename.ident.span()),
                });
            }
            UseTree::Glob(glob) => out.push(UseLeaf {
                path: prefix.clone(),
                alias: None,
                line: line(glob.star_token.span),
            }),
            UseTree::Group(group) => {
                for tree in &group.items {
                    walk(tree, prefix, out);
                }
            }
        }
    }
    let mut prefix = Vec::new();
    if item.leading_colon.is_some() {
        prefix.push("::".to_string());
    }
    let mut out = Vec::new();
    walk(&item.tree, &mut prefix, &mut out);
    out
}

fn line(span: Span) -> usize {
    span.start().line
}

fn path_segments(path: &syn::Path) -> Vec<String> {
    let mut segments = Vec::new();
    if path.leading_colon.is_some() {
        segments.push("::".to_string());
    }
    segments.extend(path.segments.iter().map(|s| s.ident.to_string()));
    segments
}

fn path_line(path: &syn::Path) -> usize {
    match (&path.leading_colon, path.segments.first()) {
        (Some(colon), _) => line(colon.spans[0]),
        (None, Some(first)) => line(first.ident.span()),
        (None, None) => 0,
    }
}

/// `#[cfg(test)]` (or a `cfg` that needs `test` and does not negate it), `#[test]`,
/// `#[tokio::test]`.
fn is_test_code(attrs: &[Attribute]) -> bool {
    attrs.iter().any(|attr| {
        let path = attr.path();
        if path.is_ident("cfg") {
            let syn::Meta::List(list) = &attr.meta else {
                return false;
            };
            let idents = idents_of(list.tokens.clone());
            idents.iter().any(|i| i == "test") && !idents.iter().any(|i| i == "not")
        } else {
            path.segments.last().is_some_and(|s| s.ident == "test")
        }
    })
}

fn idents_of(tokens: TokenStream) -> Vec<String> {
    let mut out = Vec::new();
    for tree in tokens {
        match tree {
            TokenTree::Ident(ident) => out.push(ident.to_string()),
            TokenTree::Group(group) => out.extend(idents_of(group.stream())),
            _ => {}
        }
    }
    out
}

fn is_include(mac: &Macro) -> bool {
    let segments = path_segments(&mac.path);
    matches!(
        segments.iter().map(String::as_str).collect::<Vec<_>>()[..],
        ["include"] | ["std", "include"] | ["core", "include"] | ["::", "std", "include"]
    )
}

/// The paths of more than one segment in a macro's tokens that did not parse as
/// expressions (`tokio::select!`, `macro_rules!`, `json!`): `a::b::c`, `::a::b`,
/// `$crate::x`, each with its line. A lone identifier is not taken: inside a macro it
/// is as likely a variable as a name.
fn token_paths(tokens: TokenStream) -> Vec<(Vec<String>, usize)> {
    fn is_colon2(trees: &[TokenTree], at: usize) -> bool {
        matches!(
            (trees.get(at), trees.get(at + 1)),
            (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':'
        )
    }
    fn walk(tokens: TokenStream, out: &mut Vec<(Vec<String>, usize)>) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut at = 0;
        while at < trees.len() {
            let after_dot =
                at > 0 && matches!(&trees[at - 1], TokenTree::Punct(p) if p.as_char() == '.');
            let (mut segments, first_line, mut next) = match &trees[at] {
                TokenTree::Group(group) => {
                    walk(group.stream(), out);
                    at += 1;
                    continue;
                }
                TokenTree::Ident(ident) if !after_dot => {
                    (vec![ident.to_string()], line(ident.span()), at + 1)
                }
                TokenTree::Punct(p) if p.as_char() == ':' && is_colon2(&trees, at) => {
                    let global = at == 0
                        || !matches!(&trees[at - 1], TokenTree::Ident(_) | TokenTree::Punct(_));
                    match trees.get(at + 2) {
                        Some(TokenTree::Ident(ident)) if global => (
                            vec!["::".to_string(), ident.to_string()],
                            line(p.span()),
                            at + 3,
                        ),
                        _ => {
                            at += 2;
                            continue;
                        }
                    }
                }
                _ => {
                    at += 1;
                    continue;
                }
            };
            while is_colon2(&trees, next) {
                let Some(TokenTree::Ident(ident)) = trees.get(next + 2) else {
                    break;
                };
                segments.push(ident.to_string());
                next += 3;
            }
            let real = segments.iter().filter(|s| *s != "::").count();
            if real > 1 || (segments[0] == "::" && real == 1) {
                out.push((segments, first_line));
            }
            at = next;
        }
    }
    let mut out = Vec::new();
    walk(tokens, &mut out);
    out
}

// ---------------------------------------------------------------------------------------
// What the rules look at, gathered from the syntax tree once.

/// A path in the code and what it names.
#[derive(Debug, Clone)]
struct Ref {
    line: usize,
    target: Target,
    /// A `use …::*`.
    glob: bool,
}

/// A `Result` whose error is text or an untyped box.
#[derive(Debug, Clone)]
struct UntypedError {
    line: usize,
    /// `Result<_, String>`, `Result<_, &str>` or `Result<_, Box<dyn Error>>`.
    written: &'static str,
    /// The enclosing items (`Registry::restore`), for the allow-list.
    context: String,
    test: bool,
}

/// A struct or enum whose name ends in `Error`.
#[derive(Debug, Clone)]
struct ErrorType {
    line: usize,
    name: String,
    derives_thiserror: bool,
    test: bool,
}

/// A macro call (`println!`, `print_line!`), by the last segment of its path.
#[derive(Debug, Clone)]
struct MacroCall {
    line: usize,
    name: String,
    /// The variables its format string names (`{job_id:?}`), when its first argument is a
    /// string literal.
    captures: Vec<String>,
    test: bool,
}

/// The variables a format string names itself (`{name}`, `{name:?}`), which a macro that
/// wraps its arguments never sees.
fn format_captures(format: &str) -> Vec<String> {
    let mut captures = Vec::new();
    let mut rest = format;
    while let Some(open) = rest.find('{') {
        rest = &rest[open + 1..];
        if let Some(after) = rest.strip_prefix('{') {
            rest = after;
            continue;
        }
        let end = rest.find(['}', ':']).unwrap_or(rest.len());
        let name = &rest[..end];
        if name.starts_with(|c: char| c.is_alphabetic() || c == '_') {
            captures.push(name.to_string());
        }
    }
    captures
}

/// Everything the rules need from one unit of code: a file of `host/src`, or a file one
/// of them includes.
#[derive(Debug, Clone)]
struct UnitFacts {
    /// The file as the messages name it.
    label: String,
    /// The file of `host/src` it is part of (itself, or the file that includes it): what
    /// the rules about places ("only in `mount/`") look at.
    home: String,
    module: Vec<String>,
    krate: Krate,
    included: bool,
    /// The file starts with a `//!` comment.
    starts_with_module_doc: bool,
    refs: Vec<Ref>,
    untyped_errors: Vec<UntypedError>,
    error_types: Vec<ErrorType>,
    macro_calls: Vec<MacroCall>,
}

/// The host's source, read: every unit's facts, the library's module scopes (for the
/// rules that follow names), and what could not be read.
struct Analysis {
    units: Vec<UnitFacts>,
    scopes: BTreeMap<Vec<String>, Scope>,
    externs: BTreeSet<String>,
    /// Files that do not parse, `include!`s that cannot be followed, `#[path]` modules.
    unreadable: Vec<Violation>,
}

impl Analysis {
    fn resolver(&self) -> Resolver<'_> {
        Resolver {
            scopes: &self.scopes,
            externs: &self.externs,
        }
    }
}

/// Where the analysis finds files an `include!` names.
struct Inputs<'a> {
    sources: &'a [Source],
    /// The crates a path may start with: std's and the host's dependencies.
    externs: BTreeSet<String>,
    /// What `env!("OUT_DIR")` is in the host's build.
    out_dir: Option<String>,
    /// To read an included file that is not among `sources`.
    repo: Option<PathBuf>,
}

/// A parsed unit before its facts are gathered.
struct Unit {
    label: String,
    home: String,
    module: Vec<String>,
    krate: Krate,
    included: bool,
    syntax: syn::File,
}

fn analyze(inputs: &Inputs) -> Analysis {
    let mut unreadable = Vec::new();
    let mut units = Vec::new();
    for source in inputs.sources {
        match syn::parse_file(&source.text) {
            Ok(syntax) => units.push(Unit {
                label: source.path.clone(),
                home: source.path.clone(),
                module: module_of(&source.path),
                krate: krate_of(&source.path),
                included: false,
                syntax,
            }),
            Err(error) => unreadable.push(Violation {
                file: source.path.clone(),
                line: line(error.span()),
                key: "parse".into(),
                message: format!("does not parse as Rust: {error}"),
            }),
        }
    }

    // `include!`d files join the module that includes them (and are not modules of
    // their own).
    let mut included = BTreeSet::new();
    let mut next = 0;
    while next < units.len() && units.len() < inputs.sources.len() + 64 {
        let mut found = Vec::new();
        find_includes(&units[next].syntax.items, &units[next].module, &mut found);
        let including = &units[next];
        let found: Vec<_> = found
            .into_iter()
            .map(|(module, mac)| {
                let read = read_include(inputs, &including.home, mac);
                (
                    module,
                    read,
                    line(mac.path.segments[0].ident.span()),
                    mac.tokens.to_string(),
                )
            })
            .collect();
        let (home, krate, including) = (
            including.home.clone(),
            including.krate,
            including.label.clone(),
        );
        for (module, read, at, tokens) in found {
            let Some((label, text)) = read else {
                unreadable.push(Violation {
                    file: including.clone(),
                    line: at,
                    key: "include!".into(),
                    message: format!(
                        "`include!({tokens})`: the floors test cannot find the file, so its code goes unchecked: name it with a literal path or `concat!(env!(\"OUT_DIR\"), …)`"
                    ),
                });
                continue;
            };
            match syn::parse_file(&text) {
                Ok(syntax) => {
                    included.insert(label.clone());
                    units.push(Unit {
                        label,
                        home: home.clone(),
                        module,
                        krate,
                        included: true,
                        syntax,
                    });
                }
                Err(error) => unreadable.push(Violation {
                    file: label,
                    line: line(error.span()),
                    key: "parse".into(),
                    message: format!(
                        "included by {including}, does not parse as Rust items: {error}"
                    ),
                }),
            }
        }
        next += 1;
    }
    units.retain(|unit| unit.included || !included.contains(&unit.label));

    // The library's module scopes and its modules under `#[cfg(test)]`. (The binary's
    // one file resolves on its own scope.)
    let mut scopes: BTreeMap<Krate, BTreeMap<Vec<String>, Scope>> = BTreeMap::new();
    let mut test_modules: BTreeSet<(Krate, Vec<String>)> = BTreeSet::new();
    for unit in &units {
        let mut collector = Collector {
            scopes: scopes.entry(unit.krate).or_default(),
            tests: BTreeSet::new(),
            module: unit.module.clone(),
            fn_depth: 0,
        };
        collector.scopes.entry(unit.module.clone()).or_default();
        collector.visit_file(&unit.syntax);
        test_modules.extend(collector.tests.into_iter().map(|m| (unit.krate, m)));
    }

    let empty = BTreeMap::new();
    let mut facts = Vec::new();
    for unit in &units {
        let in_test_module = (0..=unit.module.len())
            .any(|n| test_modules.contains(&(unit.krate, unit.module[..n].to_vec())));
        let mut walker = Walker {
            resolver: Resolver {
                scopes: scopes.get(&unit.krate).unwrap_or(&empty),
                externs: &inputs.externs,
            },
            label: unit.label.clone(),
            module: unit.module.clone(),
            test: usize::from(in_test_module),
            context: Vec::new(),
            type_path_pending: false,
            exempt: BTreeSet::new(),
            facts: UnitFacts {
                label: unit.label.clone(),
                home: unit.home.clone(),
                module: unit.module.clone(),
                krate: unit.krate,
                included: unit.included,
                starts_with_module_doc: unit.syntax.attrs.first().is_some_and(|attr| {
                    attr.path().is_ident("doc") && matches!(attr.style, syn::AttrStyle::Inner(_))
                }),
                refs: Vec::new(),
                untyped_errors: Vec::new(),
                error_types: Vec::new(),
                macro_calls: Vec::new(),
            },
            unreadable: Vec::new(),
        };
        walker.visit_file(&unit.syntax);
        unreadable.append(&mut walker.unreadable);
        facts.push(walker.facts);
    }
    Analysis {
        units: facts,
        scopes: scopes.remove(&Krate::Lib).unwrap_or_default(),
        externs: inputs.externs.clone(),
        unreadable,
    }
}

/// The `include!` items of a file, with the module (inline `mod`s included) they stand in.
fn find_includes<'a>(
    items: &'a [Item],
    module: &[String],
    out: &mut Vec<(Vec<String>, &'a Macro)>,
) {
    for item in items {
        match item {
            Item::Macro(item) if is_include(&item.mac) => out.push((module.to_vec(), &item.mac)),
            Item::Mod(item) => {
                if let Some((_, items)) = &item.content {
                    let mut inner = module.to_vec();
                    inner.push(item.ident.to_string());
                    find_includes(items, &inner, out);
                }
            }
            _ => {}
        }
    }
}

/// The file an `include!` names, as (label, text): a literal path (relative to the
/// including file) or `concat!` of literals and `env!("OUT_DIR")`.
fn read_include(inputs: &Inputs, home: &str, mac: &Macro) -> Option<(String, String)> {
    fn evaluate(expr: &Expr, out_dir: Option<&str>) -> Option<String> {
        match expr {
            Expr::Lit(syn::ExprLit {
                lit: Lit::Str(text),
                ..
            }) => Some(text.value()),
            Expr::Macro(inner) if inner.mac.path.is_ident("concat") => inner
                .mac
                .parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated)
                .ok()?
                .iter()
                .map(|part| evaluate(part, out_dir))
                .collect(),
            Expr::Macro(inner) if inner.mac.path.is_ident("env") => {
                let name: syn::LitStr = inner.mac.parse_body().ok()?;
                (name.value() == "OUT_DIR")
                    .then_some(out_dir)
                    .flatten()
                    .map(str::to_string)
            }
            _ => None,
        }
    }
    let expr: Expr = mac.parse_body().ok()?;
    let named = evaluate(&expr, inputs.out_dir.as_deref())?;
    if Path::new(&named).is_absolute() {
        let label = match inputs.out_dir.as_deref() {
            Some(out_dir) if named.starts_with(out_dir) => {
                format!("$OUT_DIR{}", &named[out_dir.len()..])
            }
            _ => named.clone(),
        };
        let text = std::fs::read_to_string(&named).ok()?;
        return Some((label, text));
    }
    // Relative to the including file's directory, `..` folded.
    let mut parts: Vec<&str> = home.split('/').collect();
    parts.pop();
    for part in named.split('/') {
        match part {
            "." | "" => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    let label = parts.join("/");
    if let Some(source) = inputs.sources.iter().find(|s| s.path == label) {
        return Some((label, source.text.clone()));
    }
    let text = std::fs::read_to_string(inputs.repo.as_ref()?.join(&label)).ok()?;
    Some((label, text))
}

/// Gathers the names of each module: items, child modules, `use`s, globs.
struct Collector<'a> {
    scopes: &'a mut BTreeMap<Vec<String>, Scope>,
    tests: BTreeSet<Vec<String>>,
    module: Vec<String>,
    fn_depth: usize,
}

impl Collector<'_> {
    fn scope(&mut self) -> &mut Scope {
        self.scopes.entry(self.module.clone()).or_default()
    }

    fn define(&mut self, name: String) {
        if self.fn_depth == 0 {
            self.scope().items.insert(name);
        }
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item_mod(&mut self, node: &'ast syn::ItemMod) {
        let name = node.ident.to_string();
        self.scope().items.insert(name.clone());
        self.scope().children.insert(name.clone());
        self.module.push(name);
        if is_test_code(&node.attrs) {
            self.tests.insert(self.module.clone());
        }
        self.scope();
        if let Some((_, items)) = &node.content {
            for item in items {
                self.visit_item(item);
            }
        }
        self.module.pop();
    }

    fn visit_item_use(&mut self, node: &'ast ItemUse) {
        for leaf in use_leaves(node) {
            match leaf.alias {
                None => self.scope().globs.push(leaf.path),
                Some(alias) if alias == "_" => {}
                Some(alias) => {
                    self.scope().aliases.insert(alias, leaf.path);
                }
            }
        }
    }

    fn visit_item_extern_crate(&mut self, node: &'ast syn::ItemExternCrate) {
        let name = node
            .rename
            .as_ref()
            .map_or(&node.ident, |(_, rename)| rename);
        let path = vec!["::".to_string(), node.ident.to_string()];
        self.scope().aliases.insert(name.to_string(), path);
    }

    fn visit_item_fn(&mut self, node: &'ast syn::ItemFn) {
        self.define(node.sig.ident.to_string());
        self.fn_depth += 1;
        visit::visit_item_fn(self, node);
        self.fn_depth -= 1;
    }

    fn visit_impl_item_fn(&mut self, node: &'ast syn::ImplItemFn) {
        self.fn_depth += 1;
        visit::visit_impl_item_fn(self, node);
        self.fn_depth -= 1;
    }

    fn visit_trait_item_fn(&mut self, node: &'ast syn::TraitItemFn) {
        self.fn_depth += 1;
        visit::visit_trait_item_fn(self, node);
        self.fn_depth -= 1;
    }

    fn visit_item_struct(&mut self, node: &'ast syn::ItemStruct) {
        self.define(node.ident.to_string());
    }

    fn visit_item_enum(&mut self, node: &'ast syn::ItemEnum) {
        self.define(node.ident.to_string());
    }

    fn visit_item_union(&mut self, node: &'ast syn::ItemUnion) {
        self.define(node.ident.to_string());
    }

    fn visit_item_trait(&mut self, node: &'ast syn::ItemTrait) {
        self.define(node.ident.to_string());
        visit::visit_item_trait(self, node);
    }

    fn visit_item_type(&mut self, node: &'ast syn::ItemType) {
        self.define(node.ident.to_string());
    }

    fn visit_item_const(&mut self, node: &'ast syn::ItemConst) {
        self.define(node.ident.to_string());
        visit::visit_item_const(self, node);
    }

    fn visit_item_static(&mut self, node: &'ast syn::ItemStatic) {
        self.define(node.ident.to_string());
        visit::visit_item_static(self, node);
    }

    fn visit_item_macro(&mut self, node: &'ast syn::ItemMacro) {
        if let Some(ident) = &node.ident {
            self.define(ident.to_string());
        }
    }
}

/// Walks one unit and writes down its facts.
struct Walker<'a> {
    resolver: Resolver<'a>,
    label: String,
    module: Vec<String>,
    /// Above zero inside test code.
    test: usize,
    /// The enclosing items' names.
    context: Vec<String>,
    /// The next `visit_path` is a type's, whose single segment counts (in an expression a
    /// lone name is as likely a local variable).
    type_path_pending: bool,
    /// The type arguments of a `wasmtime::Result`, where `Result<T, String>` is the
    /// generated signature of a WIT `result<T, string>`.
    exempt: BTreeSet<usize>,
    facts: UnitFacts,
    unreadable: Vec<Violation>,
}

impl Walker<'_> {
    fn record(&mut self, path: &[String], line: usize, glob: bool) {
        let target = self.resolver.resolve(&self.module, path);
        self.facts.refs.push(Ref { line, target, glob });
    }

    fn resolve(&self, path: &syn::Path) -> Target {
        self.resolver.resolve(&self.module, &path_segments(path))
    }

    fn enter(&mut self, attrs: &[Attribute]) -> bool {
        let test = is_test_code(attrs);
        self.test += usize::from(test);
        test
    }

    fn leave(&mut self, test: bool) {
        self.test -= usize::from(test);
    }

    /// The enclosing items, for an allow-list key.
    fn context(&self) -> String {
        if self.context.is_empty() {
            "(module)".into()
        } else {
            self.context.join("::")
        }
    }

    /// `String`, `&str` or `Box<dyn Error>` as an error type.
    fn untyped(&self, ty: &Type) -> Option<&'static str> {
        match ty {
            Type::Paren(inner) => self.untyped(&inner.elem),
            Type::Group(inner) => self.untyped(&inner.elem),
            Type::Reference(reference) => match &*reference.elem {
                Type::Path(path) if path.path.is_ident("str") => Some("Result<_, &str>"),
                _ => None,
            },
            Type::Path(path) if path.qself.is_none() => {
                let last = path.path.segments.last()?;
                let target = self.resolve(&path.path);
                if last.ident == "String" && !matches!(target, Target::Crate(_)) {
                    return Some("Result<_, String>");
                }
                if last.ident != "Box" || matches!(target, Target::Crate(_)) {
                    return None;
                }
                let PathArguments::AngleBracketed(args) = &last.arguments else {
                    return None;
                };
                let Some(GenericArgument::Type(Type::TraitObject(object))) = args.args.first()
                else {
                    return None;
                };
                object.bounds.iter().find_map(|bound| match bound {
                    TypeParamBound::Trait(bound)
                        if bound
                            .path
                            .segments
                            .last()
                            .is_some_and(|s| s.ident == "Error")
                            && !matches!(self.resolve(&bound.path), Target::Crate(_)) =>
                    {
                        Some("Result<_, Box<dyn Error>>")
                    }
                    _ => None,
                })
            }
            _ => None,
        }
    }

    fn check_result(&mut self, node: &TypePath) {
        let Some(last) = node.path.segments.last() else {
            return;
        };
        if last.ident != "Result" || self.exempt.contains(&(node as *const TypePath as usize)) {
            return;
        }
        let PathArguments::AngleBracketed(args) = &last.arguments else {
            return;
        };
        let types: Vec<&Type> = args
            .args
            .iter()
            .filter_map(|arg| match arg {
                GenericArgument::Type(ty) => Some(ty),
                _ => None,
            })
            .collect();
        let [ok, .., error] = types[..] else {
            return;
        };
        // `Result<hcl::Value, String>` is the signature hcl-rs gives the jobspec
        // functions (`hcl::eval::Func`): the text is what hcl-rs shows the user.
        if let Type::Path(ok) = ok
            && let Target::Extern(path) = self.resolve(&ok.path)
            && path.first().is_some_and(|c| c == "hcl")
            && path.last().is_some_and(|t| t == "Value")
        {
            return;
        }
        if let Some(written) = self.untyped(error) {
            self.facts.untyped_errors.push(UntypedError {
                line: path_line(&node.path),
                written,
                context: self.context(),
                test: self.test > 0,
            });
        }
    }

    fn note_type(&mut self, ident: &syn::Ident, attrs: &[Attribute]) {
        let mut derives_thiserror = false;
        for attr in attrs.iter().filter(|attr| attr.path().is_ident("derive")) {
            let Ok(paths) =
                attr.parse_args_with(Punctuated::<syn::Path, Token![,]>::parse_terminated)
            else {
                continue;
            };
            for path in &paths {
                let target = self.resolve(path);
                derives_thiserror |= target.is_extern(&["thiserror", "Error"]);
                self.record(&path_segments(path), path_line(path), false);
            }
        }
        if ident.to_string().ends_with("Error") {
            self.facts.error_types.push(ErrorType {
                line: line(ident.span()),
                name: ident.to_string(),
                derives_thiserror,
                test: self.test > 0,
            });
        }
    }
}

impl<'ast> Visit<'ast> for Walker<'_> {
    fn visit_item_use(&mut self, node: &'ast ItemUse) {
        let test = self.enter(&node.attrs);
        for leaf in use_leaves(node) {
            self.record(&leaf.path, leaf.line, leaf.alias.is_none());
        }
        self.leave(test);
    }

    fn visit_item_mod(&mut self, node: &'ast syn::ItemMod) {
        let test = self.enter(&node.attrs);
        if let Some(attr) = node.attrs.iter().find(|attr| attr.path().is_ident("path")) {
            self.unreadable.push(Violation {
                file: self.label.clone(),
                line: line(attr.pound_token.span),
                key: format!("#[path] mod {}", node.ident),
                message: "`#[path]` on a module: the floors test derives a module from its file's path; move the file instead".into(),
            });
        }
        if let Some((_, items)) = &node.content {
            self.module.push(node.ident.to_string());
            for item in items {
                self.visit_item(item);
            }
            self.module.pop();
        }
        self.leave(test);
    }

    fn visit_item_fn(&mut self, node: &'ast syn::ItemFn) {
        let test = self.enter(&node.attrs);
        self.context.push(node.sig.ident.to_string());
        visit::visit_item_fn(self, node);
        self.context.pop();
        self.leave(test);
    }

    fn visit_item_impl(&mut self, node: &'ast syn::ItemImpl) {
        let test = self.enter(&node.attrs);
        let name = match &*node.self_ty {
            Type::Path(path) => path
                .path
                .segments
                .last()
                .map_or_else(String::new, |s| s.ident.to_string()),
            _ => "impl".into(),
        };
        self.context.push(name);
        visit::visit_item_impl(self, node);
        self.context.pop();
        self.leave(test);
    }

    fn visit_impl_item_fn(&mut self, node: &'ast syn::ImplItemFn) {
        let test = self.enter(&node.attrs);
        self.context.push(node.sig.ident.to_string());
        visit::visit_impl_item_fn(self, node);
        self.context.pop();
        self.leave(test);
    }

    fn visit_item_struct(&mut self, node: &'ast syn::ItemStruct) {
        let test = self.enter(&node.attrs);
        self.note_type(&node.ident, &node.attrs);
        self.context.push(node.ident.to_string());
        visit::visit_item_struct(self, node);
        self.context.pop();
        self.leave(test);
    }

    fn visit_item_enum(&mut self, node: &'ast syn::ItemEnum) {
        let test = self.enter(&node.attrs);
        self.note_type(&node.ident, &node.attrs);
        self.context.push(node.ident.to_string());
        visit::visit_item_enum(self, node);
        self.context.pop();
        self.leave(test);
    }

    fn visit_item_type(&mut self, node: &'ast syn::ItemType) {
        let test = self.enter(&node.attrs);
        self.context.push(format!("type {}", node.ident));
        visit::visit_item_type(self, node);
        self.context.pop();
        self.leave(test);
    }

    fn visit_item_trait(&mut self, node: &'ast syn::ItemTrait) {
        let test = self.enter(&node.attrs);
        self.context.push(node.ident.to_string());
        visit::visit_item_trait(self, node);
        self.context.pop();
        self.leave(test);
    }

    fn visit_item_const(&mut self, node: &'ast syn::ItemConst) {
        let test = self.enter(&node.attrs);
        self.context.push(node.ident.to_string());
        visit::visit_item_const(self, node);
        self.context.pop();
        self.leave(test);
    }

    fn visit_item_static(&mut self, node: &'ast syn::ItemStatic) {
        let test = self.enter(&node.attrs);
        self.context.push(node.ident.to_string());
        visit::visit_item_static(self, node);
        self.context.pop();
        self.leave(test);
    }

    fn visit_item_macro(&mut self, node: &'ast syn::ItemMacro) {
        if is_include(&node.mac) {
            // Read as a unit of its own (or reported as unreadable).
            return;
        }
        let test = self.enter(&node.attrs);
        visit::visit_item_macro(self, node);
        self.leave(test);
    }

    fn visit_type_path(&mut self, node: &'ast TypePath) {
        if let Some(qself) = &node.qself {
            self.visit_qself(qself);
        }
        self.check_result(node);
        let mut exempt = Vec::new();
        if self.resolve(&node.path).is_extern(&["wasmtime", "Result"])
            && let Some(PathArguments::AngleBracketed(args)) =
                node.path.segments.last().map(|s| &s.arguments)
        {
            for arg in &args.args {
                if let GenericArgument::Type(Type::Path(inner)) = arg {
                    exempt.push(inner as *const TypePath as usize);
                }
            }
        }
        self.exempt.extend(exempt.iter().copied());
        self.type_path_pending = true;
        self.visit_path(&node.path);
        for inner in exempt {
            self.exempt.remove(&inner);
        }
    }

    fn visit_path(&mut self, node: &'ast syn::Path) {
        let single = std::mem::take(&mut self.type_path_pending);
        if single || node.segments.len() > 1 || node.leading_colon.is_some() {
            self.record(&path_segments(node), path_line(node), false);
        }
        visit::visit_path(self, node);
    }

    fn visit_macro(&mut self, node: &'ast Macro) {
        self.type_path_pending = false;
        if is_include(node) {
            self.unreadable.push(Violation {
                file: self.label.clone(),
                line: path_line(&node.path),
                key: "include!".into(),
                message: "`include!` in an expression or statement: the floors test reads only an `include!` that stands as an item".into(),
            });
            return;
        }
        self.record(&path_segments(&node.path), path_line(&node.path), false);
        if let Some(name) = node.path.segments.last() {
            let captures = node
                .parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated)
                .ok()
                .and_then(|exprs| match exprs.first() {
                    Some(Expr::Lit(syn::ExprLit {
                        lit: Lit::Str(format),
                        ..
                    })) => Some(format_captures(&format.value())),
                    _ => None,
                })
                .unwrap_or_default();
            self.facts.macro_calls.push(MacroCall {
                line: path_line(&node.path),
                name: name.ident.to_string(),
                captures,
                test: self.test > 0,
            });
        }
        if let Ok(exprs) = node.parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated) {
            for expr in &exprs {
                self.visit_expr(expr);
            }
        } else {
            for (path, line) in token_paths(node.tokens.clone()) {
                self.record(&path, line, false);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The rules.

/// Floors: a module may import only modules on lower floors (and itself). `floors`
/// maps a top-level module to its floor number. Every path counts: `use` trees, paths in
/// expressions and types, paths in macro calls; `super::` chains are followed to the
/// module they reach.
fn upward_imports(analysis: &Analysis, floors: &BTreeMap<String, usize>) -> Vec<Violation> {
    let mut violations = Vec::new();
    for unit in analysis.units.iter().filter(|u| u.krate == Krate::Lib) {
        let Some(module) = unit.module.first() else {
            continue;
        };
        let Some(&own_floor) = floors.get(module) else {
            if !unit.included {
                violations.push(Violation {
                    file: unit.label.clone(),
                    line: 1,
                    key: format!("floor of {module}"),
                    message: format!(
                        "module `{module}` stands on no floor: add it to the Floors block of ARCHITECTURE.md"
                    ),
                });
            }
            continue;
        };
        for r in &unit.refs {
            let (key, message) = match &r.target {
                Target::AboveRoot => (
                    "super::".to_string(),
                    "a `super::` chain above the crate root".to_string(),
                ),
                Target::Crate(path) if path.is_empty() => {
                    if !r.glob {
                        continue;
                    }
                    (
                        "crate::*".to_string(),
                        format!(
                            "`{module}` imports everything at the crate root (a glob reaching it): name the modules it uses"
                        ),
                    )
                }
                Target::Crate(path) => {
                    let target = &path[0];
                    let Some(&target_floor) = floors.get(target) else {
                        continue;
                    };
                    if target == module || target_floor < own_floor {
                        continue;
                    }
                    let why = if target_floor == own_floor {
                        "on the same floor"
                    } else {
                        "on a higher floor"
                    };
                    (
                        format!("crate::{target}"),
                        format!(
                            "`{module}` (floor {own_floor}) imports `crate::{target}` (floor {target_floor}, {why}): move the shared part down (often into `model`)"
                        ),
                    )
                }
                _ => continue,
            };
            violations.push(Violation {
                file: unit.label.clone(),
                line: r.line,
                key,
                message,
            });
        }
    }
    dedup(violations)
}

/// Only `crates/sys/src/mount/` calls mount(2) and friends, in every crate.
fn mount_syscalls_outside_mount(analysis: &Analysis) -> Vec<Violation> {
    const FLAG_TYPES: &[&str] = &["MountPropagationFlags", "MountFlags", "UnmountFlags"];
    const CALLS: &[&str] = &[
        "mount",
        "umount",
        "umount2",
        "move_mount",
        "fsmount",
        "fsopen",
        "fsconfig",
        "fspick",
        "open_tree",
        "mount_setattr",
    ];
    fn is_mount_syscall(path: &[String]) -> bool {
        let at = |i: usize| path.get(i).map(String::as_str);
        let names_call = |name: &str| {
            CALLS.contains(&name)
                || name
                    .strip_prefix("SYS_")
                    .is_some_and(|n| CALLS.contains(&n))
        };
        match at(0) {
            // `rustix::mount`, or anything in it that is not a flag type.
            Some("rustix") if at(1) == Some("mount") => {
                !at(2).is_some_and(|name| FLAG_TYPES.contains(&name))
            }
            Some("nix") if at(1) == Some("mount") => true,
            // The functions of `berth_sys::mount` are the way to mount.
            Some("berth_sys") => false,
            Some("libc") => at(1).is_some_and(names_call),
            _ => path[1..]
                .iter()
                .any(|segment| names_call(segment) && segment != "mount"),
        }
    }
    places_outside(
        analysis,
        "crates/sys/src/mount/",
        |target| matches!(target, Target::Extern(path) if is_mount_syscall(path)),
        "a mount syscall outside crates/sys/src/mount/: add a function to `berth_sys::mount` \
         and call that",
    )
}

/// The runners reach privileged operations only through `sys::Sys` (its Linux side, or
/// the recording fake in their unit tests): no cgroup, ownership, user-database or
/// rlimit call in `task_runner/` or `alloc_runner/`. `Cgroups::task_name` and
/// `Cgroups::collectors_name` are pure naming functions and allowed.
fn privileged_calls_in_runners(analysis: &Analysis) -> Vec<Violation> {
    const EXTERN_CALLS: &[&str] = &[
        "chown",
        "fchown",
        "lchown",
        "chownat",
        "fchownat",
        "setrlimit",
        "prlimit",
        "kill_process",
        "kill_process_group",
    ];
    // `berth_sys::cgroup::…` and `berth_sys::process::users::…`, but for the naming
    // functions; `berth_sys::Sys` itself is the way through.
    let reaches_past_sys = |path: &[String]| {
        let at = |i: usize| path.get(i).map(String::as_str);
        (at(0) == Some("cgroup")
            && !(at(1) == Some("Cgroups")
                && matches!(at(2), Some("task_name" | "collectors_name"))))
            || (at(0) == Some("process") && at(1) == Some("users"))
    };
    let forbidden = |target: &Target| match target {
        Target::Extern(path) if path[0] == "berth_sys" => reaches_past_sys(&path[1..]),
        Target::Extern(path) => {
            (path[0] == "rustix" || path[0] == "libc" || path[0] == "nix")
                && path
                    .last()
                    .is_some_and(|name| EXTERN_CALLS.contains(&name.as_str()))
        }
        _ => false,
    };
    let mut violations = Vec::new();
    for unit in analysis.units.iter().filter(|u| {
        u.home.starts_with("crates/client/src/task_runner/")
            || u.home.starts_with("crates/client/src/alloc_runner/")
    }) {
        for r in unit.refs.iter().filter(|r| forbidden(&r.target)) {
            violations.push(Violation {
                file: unit.label.clone(),
                line: r.line,
                key: r.target.to_string(),
                message: format!(
                    "a privileged call in a runner: go through `sys::Sys` (`{}`)",
                    r.target
                ),
            });
        }
    }
    dedup(violations)
}

/// Only `crates/runtime/src/` touches wasmtime and the generated WIT bindings.
fn bindings_outside_runtime(analysis: &Analysis) -> Vec<Violation> {
    places_outside(
        analysis,
        "crates/runtime/src/",
        |target| match target {
            Target::Extern(path) => {
                path[0].starts_with("wasmtime")
                    || path[0] == "wit_bindgen"
                    || path.starts_with(&["berth_runtime".into(), "bindings".into()])
            }
            Target::Crate(_) => false,
            Target::Local(path) => path.last().is_some_and(|name| name == "bindgen"),
            Target::AboveRoot => false,
        },
        "wasmtime or generated bindings outside crates/runtime/src/: convert to a `model` type \
         inside `berth-runtime`",
    )
}

/// Only `crates/csi/src/` and the client's etcd client (`cluster/etcd.rs` with its
/// `etcd_access.rs`) touch tonic and the protobuf types, in every crate.
fn grpc_outside_csi(analysis: &Analysis) -> Vec<Violation> {
    let mut violations = places_outside(
        analysis,
        "crates/csi/src/",
        |target| {
            matches!(
                target.extern_crate(),
                Some("tonic" | "tonic_prost" | "prost" | "prost_types" | "berth_proto")
            )
        },
        "tonic or protobuf types outside crates/csi/src/ and \
         crates/cluster/src/etcd.rs (with its \
         etcd_access.rs): convert \
         to a `model` type inside `csi` (or a plain type of the etcd client)",
    );
    // The other gRPC client: etcd's, whose callers see plain types (`Entry`, `Change`).
    // etcd_access.rs is its TLS and auth (the token interceptor, Auth.Authenticate).
    violations.retain(|v| {
        !matches!(
            v.file.as_str(),
            "crates/cluster/src/etcd.rs" | "crates/cluster/src/etcd_access.rs"
        )
    });
    violations
}

/// The CLI prints what the agent answered (names, ids, messages, meta, events: text job
/// authors, token holders and plugins chose) only through `host/src/cli/output.rs`,
/// which escapes control characters and bidirectional controls: outside it, no file of
/// `cli` calls `print!`, `println!`, `eprint!`, `eprintln!`, `write!`, `writeln!` or
/// `dbg!`, nor reaches `std::io::stdout`/`stderr`; it prints with `output::print_line!`
/// and `eprint_line!` (which escape every argument), whose format strings name no
/// variable (`{name}` would pass it unescaped), or with `output`'s functions.
fn cli_prints_outside_output(analysis: &Analysis) -> Vec<Violation> {
    const RAW_PRINTS: &[&str] = &[
        "print", "println", "eprint", "eprintln", "write", "writeln", "dbg",
    ];
    const ESCAPING_PRINTS: &[&str] = &["print_line", "eprint_line"];
    const STREAMS: &[&str] = &["stdout", "stderr", "Stdout", "Stderr"];
    let mut violations = Vec::new();
    for unit in analysis
        .units
        .iter()
        .filter(|u| u.home.starts_with("host/src/cli/") && u.home != "host/src/cli/output.rs")
    {
        for call in unit.macro_calls.iter().filter(|c| !c.test) {
            if RAW_PRINTS.contains(&call.name.as_str()) {
                violations.push(Violation {
                    file: unit.label.clone(),
                    line: call.line,
                    key: format!("{}!", call.name),
                    message: format!(
                        "`{}!` in the CLI outside output.rs: print with `output::print_line!` \
                         or `eprint_line!`, which escape what the agent answered, or an \
                         `output` function",
                        call.name
                    ),
                });
            } else if ESCAPING_PRINTS.contains(&call.name.as_str()) {
                for name in &call.captures {
                    violations.push(Violation {
                        file: unit.label.clone(),
                        line: call.line,
                        key: format!("{{{name}}}"),
                        message: format!(
                            "`{}!` names `{name}` in its format string, which passes it \
                             unescaped: pass it as an argument (`{{}}`, {name})",
                            call.name
                        ),
                    });
                }
            }
        }
        for r in &unit.refs {
            if let Target::Extern(path) = &r.target
                && path.len() >= 3
                && path[0] == "std"
                && path[1] == "io"
                && STREAMS.contains(&path[2].as_str())
            {
                violations.push(Violation {
                    file: unit.label.clone(),
                    line: r.line,
                    key: r.target.to_string(),
                    message: format!(
                        "`{}` in the CLI outside output.rs: write through an `output` function",
                        r.target
                    ),
                });
            }
        }
    }
    dedup(violations)
}

/// Nomad's answers and requests are `berth_nomad_api`'s types, which the contract
/// fixtures hold to Nomad's documented shapes: the Nomad handlers
/// (`crates/api/src/nomad/`) build none by hand with `json!` (their tests may).
fn nomad_json_by_hand(analysis: &Analysis) -> Vec<Violation> {
    let mut violations = Vec::new();
    for unit in analysis
        .units
        .iter()
        .filter(|u| u.home.starts_with("crates/api/src/nomad/"))
    {
        for call in unit
            .macro_calls
            .iter()
            .filter(|c| !c.test && c.name == "json")
        {
            violations.push(Violation {
                file: unit.label.clone(),
                line: call.line,
                key: "json!".into(),
                message: "`json!` in a Nomad handler: answer with a `berth_nomad_api` type \
                          (add the field or the type there, where the fixtures check it)"
                    .into(),
            });
        }
    }
    dedup(violations)
}

/// A violation for every path outside `home` whose target `forbidden` names.
fn places_outside(
    analysis: &Analysis,
    home: &str,
    forbidden: impl Fn(&Target) -> bool,
    message: &str,
) -> Vec<Violation> {
    let mut violations = Vec::new();
    for unit in analysis.units.iter().filter(|u| !u.home.starts_with(home)) {
        for r in unit.refs.iter().filter(|r| forbidden(&r.target)) {
            violations.push(Violation {
                file: unit.label.clone(),
                line: r.line,
                key: r.target.to_string(),
                message: format!("{message} (`{}`)", r.target),
            });
        }
    }
    dedup(violations)
}

/// Errors are typed: no `Result<_, String>`, `Result<_, &str>` or
/// `Result<_, Box<dyn Error>>` outside tests. `wasmtime::Result<Result<T, String>>` is
/// the signature of a generated host function whose WIT type is `result<T, string>`, the
/// guest's error text; `Result<hcl::Value, String>` is the signature hcl-rs gives the
/// jobspec functions (`hcl::eval::Func`), whose text hcl-rs shows the user.
fn untyped_errors(analysis: &Analysis) -> Vec<Violation> {
    let mut violations = Vec::new();
    for unit in &analysis.units {
        for found in unit.untyped_errors.iter().filter(|f| !f.test) {
            violations.push(Violation {
                file: unit.label.clone(),
                line: found.line,
                key: found.context.clone(),
                message: format!(
                    "`{}` in `{}`: give the error a type (a `thiserror` enum of the module)",
                    found.written, found.context
                ),
            });
        }
    }
    dedup(violations)
}

/// Error types are `thiserror` types: every struct or enum whose name ends in `Error`
/// derives `thiserror::Error` (`#[derive(thiserror::Error)]`, or `#[derive(Error)]` with
/// `use thiserror::Error`), outside tests.
fn error_types_without_thiserror(analysis: &Analysis) -> Vec<Violation> {
    let mut violations = Vec::new();
    for unit in &analysis.units {
        for found in unit
            .error_types
            .iter()
            .filter(|e| !e.test && !e.derives_thiserror)
        {
            violations.push(Violation {
                file: unit.label.clone(),
                line: found.line,
                key: found.name.clone(),
                message: format!(
                    "`{}` does not derive `thiserror::Error`: error types are `thiserror` types",
                    found.name
                ),
            });
        }
    }
    violations
}

/// No circles inside a folder: among the modules of one directory of `host/src` (its
/// files and sub-directories), the imports form no cycle. A path into a sibling module
/// (`super::hooks::X`, `crate::task_runner::hooks::X`) is an edge to it; a path to an
/// item of the folder's `mod.rs` that is a `use` of a sibling's item (`pub use
/// hooks::HookError`) is an edge to that sibling. The folder's `mod.rs` itself is not a
/// node: it declares the files and holds what they share, the way `model` does for the
/// floors. Test code counts.
fn folder_circles(analysis: &Analysis) -> Vec<Violation> {
    /// (from, to) -> the file and line of the first such import.
    type Edges = BTreeMap<(String, String), (String, usize)>;
    let resolver = analysis.resolver();
    let mut edges: BTreeMap<Vec<String>, Edges> = BTreeMap::new();
    for unit in analysis.units.iter().filter(|u| u.krate == Krate::Lib) {
        for depth in 1..unit.module.len() {
            let folder = &unit.module[..depth];
            let from = &unit.module[depth];
            for r in &unit.refs {
                let Target::Crate(path) = &r.target else {
                    continue;
                };
                if !path.starts_with(folder) || path.len() <= depth {
                    continue;
                }
                let Some(to) = sibling_of(&resolver, folder, &path[depth..], 0) else {
                    continue;
                };
                if &to != from {
                    edges
                        .entry(folder.to_vec())
                        .or_default()
                        .entry((from.clone(), to))
                        .or_insert((unit.label.clone(), r.line));
                }
            }
        }
    }
    let mut violations = Vec::new();
    for (folder, edges) in &edges {
        for circle in circles(edges.keys()) {
            let steps: Vec<String> = circle
                .iter()
                .zip(circle.iter().cycle().skip(1))
                .map(|(from, to)| {
                    let (file, line) = &edges[&(from.clone(), to.clone())];
                    format!("{file}:{line} imports `{to}`")
                })
                .collect();
            let (file, line) = &edges[&(circle[0].clone(), circle[1].clone())];
            let mut members = circle.clone();
            members.sort();
            members.dedup();
            violations.push(Violation {
                file: file.clone(),
                line: *line,
                key: members.join(" <-> "),
                message: format!(
                    "a circle inside host/src/{}/: {}; move what they share into one of them or a third file",
                    folder.join("/"),
                    steps.join(", ")
                ),
            });
        }
    }
    violations
}

/// Which module of `folder` (a child file or directory) `rest`, a path inside `folder`,
/// leads to; `None` for an item of the folder's own `mod.rs`.
fn sibling_of(
    resolver: &Resolver,
    folder: &[String],
    rest: &[String],
    depth: usize,
) -> Option<String> {
    let scope = resolver.scopes.get(folder)?;
    let name = &rest[0];
    if scope.children.contains(name) {
        return Some(name.clone());
    }
    if depth > 8 {
        return None;
    }
    // `pub use hooks::X;` in the folder's `mod.rs`, or a glob of a sibling.
    if let Some(path) = scope.aliases.get(name)
        && let Target::Crate(target) = resolver.resolve(folder, path)
        && target.starts_with(folder)
        && target.len() > folder.len()
    {
        return sibling_of(resolver, folder, &target[folder.len()..], depth + 1);
    }
    if scope.items.contains(name) {
        return None;
    }
    for glob in &scope.globs {
        if let Target::Crate(from) = resolver.resolve(folder, glob)
            && from.starts_with(folder)
            && from.len() > folder.len()
            && resolver.lookup(&from, name, 0).is_some()
        {
            return Some(from[folder.len()].clone());
        }
    }
    // Not re-exported: the one sibling that defines it.
    let mut definers = scope.children.iter().filter(|child| {
        let mut module = folder.to_vec();
        module.push((*child).clone());
        resolver
            .scopes
            .get(&module)
            .is_some_and(|s| s.items.contains(name))
    });
    match (definers.next(), definers.next()) {
        (Some(only), None) => Some(only.clone()),
        _ => None,
    }
}

/// The strongly connected components of more than one node, each as a cycle through all
/// of its nodes when there is one (else its nodes in order).
fn circles<'a>(edges: impl Iterator<Item = &'a (String, String)>) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (from, to) in edges {
        next.entry(from).or_default().insert(to);
        next.entry(to).or_default();
    }
    let reach = |start: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![start];
        while let Some(node) = stack.pop() {
            for &to in &next[node] {
                if seen.insert(to) {
                    stack.push(to);
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&str, BTreeSet<&str>> = next.keys().map(|&n| (n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for &node in next.keys() {
        if done.contains(node) || !reaches[node].contains(node) {
            continue;
        }
        let component: BTreeSet<&str> = reaches[node]
            .iter()
            .copied()
            .filter(|other| reaches[other].contains(node))
            .collect();
        done.extend(component.iter().copied());
        // A closed walk through the component: from each node, the shortest path (inside
        // the component) to the next unvisited one, and back to the start.
        let path_to = |from: &str, to: &str| -> Vec<String> {
            let mut before: BTreeMap<&str, &str> = BTreeMap::new();
            let mut queue = std::collections::VecDeque::from([from]);
            while let Some(at) = queue.pop_front() {
                for &step in &next[at] {
                    if component.contains(step) && !before.contains_key(step) && step != from {
                        before.insert(step, at);
                        queue.push_back(step);
                    }
                }
            }
            let mut path = vec![to.to_string()];
            let mut at = to;
            while let Some(&prev) = before.get(at) {
                if prev == from {
                    break;
                }
                path.push(prev.to_string());
                at = prev;
            }
            path.reverse();
            path
        };
        let mut walk = vec![node.to_string()];
        let mut at = node;
        for &target in component.iter().filter(|&&n| n != node) {
            if walk.iter().any(|w| w == target) {
                continue;
            }
            let steps = path_to(at, target);
            walk.extend(steps);
            at = target;
        }
        let back = path_to(at, node);
        walk.extend(back.into_iter().filter(|n| n != node));
        out.push(walk);
    }
    out
}

/// Files of `host/src` longer than this hold more than one responsibility, unless the
/// allow-list says why not.
const MAX_LINES: usize = 900;

/// No file of `host/src` over `MAX_LINES` lines.
fn oversized_files(sources: &[Source]) -> Vec<Violation> {
    sources
        .iter()
        .filter(|s| s.text.lines().count() > MAX_LINES)
        .map(|s| Violation {
            file: s.path.clone(),
            line: MAX_LINES + 1,
            key: "size".into(),
            message: format!(
                "{} lines (more than {MAX_LINES}): split it by responsibility",
                s.text.lines().count()
            ),
        })
        .collect()
}

/// Every module file starts with a `//!` doc comment saying what it is for.
fn missing_module_doc(analysis: &Analysis) -> Vec<Violation> {
    analysis
        .units
        .iter()
        .filter(|u| !u.included && !u.starts_with_module_doc)
        .map(|u| Violation {
            file: u.label.clone(),
            line: 1,
            key: "//!".into(),
            message: "the file does not start with a `//!` comment saying what the module is for"
                .into(),
        })
        .collect()
}

/// Everything is read: every file parses, every `include!` is followed, no module is
/// moved with `#[path]`.
fn unreadable_source(analysis: &Analysis) -> Vec<Violation> {
    analysis.unreadable.clone()
}

fn dedup(mut violations: Vec<Violation>) -> Vec<Violation> {
    let mut seen = BTreeSet::new();
    violations.retain(|v| seen.insert((v.file.clone(), v.line, v.key.clone())));
    violations
}

/// ARCHITECTURE.md names every module directory of `host/src`, and every `host/src/…`
/// and `crates/…` path it names exists.
fn architecture_map(
    architecture: &str,
    dirs: &[String],
    exists: impl Fn(&str) -> bool,
) -> Vec<Violation> {
    let mut violations = Vec::new();
    for dir in dirs {
        if !architecture.contains(&format!("{dir}/")) {
            violations.push(Violation {
                file: "ARCHITECTURE.md".into(),
                line: 1,
                key: dir.clone(),
                message: format!("the module directory `{dir}/` is not in the code map"),
            });
        }
    }
    for (i, line) in architecture.lines().enumerate() {
        let named = line
            .match_indices("host/src/")
            .chain(line.match_indices("crates/").filter(|(at, _)| {
                // `crates/` as a path of its own, not the tail of another (`foo_crates/`).
                line[..*at]
                    .chars()
                    .next_back()
                    .is_none_or(|c| !c.is_alphanumeric() && !matches!(c, '/' | '_' | '-'))
            }));
        for (at, _) in named {
            let path: String = line[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || matches!(c, '/' | '_' | '.' | '-'))
                .collect();
            let path = path.trim_end_matches('.');
            if !exists(path) {
                violations.push(Violation {
                    file: "ARCHITECTURE.md".into(),
                    line: i + 1,
                    key: path.to_string(),
                    message: format!("`{path}` does not exist"),
                });
            }
        }
    }
    violations
}

/// Every invariant of ARCHITECTURE.md's `## Invariants` list names a test that holds it
/// (a backticked path such as `module::a_test_name`; `…` stands for the path before),
/// and every test, test module or test file it names exists: an invariant worth writing
/// is worth a test, and a renamed test does not leave its invariant pointing at nothing.
fn invariants_without_tests(architecture: &str, sources: &[Source]) -> Vec<Violation> {
    let Some(section) = architecture.split("\n## Invariants").nth(1) else {
        return vec![Violation {
            file: "ARCHITECTURE.md".into(),
            line: 1,
            key: "## Invariants".into(),
            message: "ARCHITECTURE.md has no `## Invariants` section".into(),
        }];
    };
    let start = architecture.len() - section.len();
    let first_line = architecture[..start].lines().count();
    let section = section
        .split("\nChecked by `host/tests/floors.rs`")
        .next()
        .unwrap_or(section);
    let exists = |name: &str| {
        sources.iter().any(|source| {
            source.path.ends_with(&format!("/{name}.rs"))
                || source.path.ends_with(&format!("/{name}/mod.rs"))
                || source.text.contains(&format!("fn {name}("))
                || source.text.contains(&format!("mod {name} "))
                || source.text.contains(&format!("mod {name};"))
        })
    };
    let mut violations = Vec::new();
    let mut bullet: Option<(usize, String)> = None;
    let judge = |(line, text): (usize, String), violations: &mut Vec<Violation>| {
        let named: Vec<String> = text
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|code| code.contains("::") && !code.contains(' '))
            .map(|code| code.rsplit("::").next().unwrap_or("").to_string())
            .collect();
        if named.is_empty() {
            violations.push(Violation {
                file: "ARCHITECTURE.md".into(),
                line,
                key: text.chars().take(40).collect(),
                message: "an invariant that names no test (`module::test_name`) holding it".into(),
            });
        }
        for name in named {
            if !exists(&name) {
                violations.push(Violation {
                    file: "ARCHITECTURE.md".into(),
                    line,
                    key: name.clone(),
                    message: format!("the invariant names `{name}`, which no test is"),
                });
            }
        }
    };
    for (i, line) in section.lines().enumerate() {
        if let Some(rest) = line.strip_prefix("- ") {
            if let Some(done) = bullet.take() {
                judge(done, &mut violations);
            }
            bullet = Some((first_line + i, rest.to_string()));
        } else if let Some((_, text)) = &mut bullet {
            text.push(' ');
            text.push_str(line.trim());
        }
    }
    if let Some(done) = bullet.take() {
        judge(done, &mut violations);
    }
    violations
}

/// The floors from the ```` ```text ```` block under `## Floors` in ARCHITECTURE.md:
/// lines `floor N  a, b, c`.
fn parse_floors(architecture: &str) -> Result<BTreeMap<String, usize>, String> {
    let section = architecture
        .split("\n## Floors")
        .nth(1)
        .ok_or("ARCHITECTURE.md has no `## Floors` section")?;
    let block = section
        .split("```text\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .ok_or("the Floors section has no ```text block")?;
    let mut floors = BTreeMap::new();
    for line in block.lines() {
        let Some(rest) = line.trim().strip_prefix("floor") else {
            continue;
        };
        let rest = rest.trim_start();
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let floor: usize = rest[..digits]
            .parse()
            .map_err(|_| format!("cannot read the floor number in {line:?}"))?;
        for module in rest[digits..].split(|c: char| c == ',' || c.is_whitespace()) {
            if module.is_empty() {
                continue;
            }
            let module = module.trim_end_matches('/');
            if floors.insert(module.to_string(), floor).is_some() {
                return Err(format!("`{module}` stands on two floors"));
            }
        }
    }
    if floors.is_empty() {
        return Err("the Floors block lists no floor".into());
    }
    Ok(floors)
}

// ---------------------------------------------------------------------------------------
// What the rules tolerate for now.

/// A known violation: the rule, the file, the violation's key, and why it stays for now.
struct Allowed {
    rule: &'static str,
    file: &'static str,
    key: &'static str,
    reason: &'static str,
}

const ALLOWED: &[Allowed] = &[
    // Error types that are not `thiserror` types.
    Allowed {
        rule: "thiserror",
        file: "crates/api/src/lib.rs",
        key: "ApiError",
        reason: "the JSON body of an HTTP error response (serde), not a Rust error; rename it (`ErrorBody`) or derive",
    },
    Allowed {
        rule: "thiserror",
        file: "crates/csi/src/client.rs",
        key: "CsiError",
        reason: "implements Display (with a hint from its code and RPC) and std::error::Error by hand",
    },
    // Circles inside a folder (the file is the folder).
    // Files over MAX_LINES: none.
];

/// Fails with every violation that is not on `allowed`, and every entry of `allowed` for
/// `rule` that matches none.
fn assert_clean_with(rule: &str, violations: Vec<Violation>, allowed: &[Allowed]) {
    let entries: Vec<&Allowed> = allowed.iter().filter(|a| a.rule == rule).collect();
    // An entry whose file is a folder (`host/src/runtime/`) matches what is inside it.
    let matches = |a: &Allowed, v: &Violation| {
        (a.file == v.file || (a.file.ends_with('/') && v.file.starts_with(a.file)))
            && a.key == v.key
    };
    let mut listed: Vec<String> = violations
        .iter()
        .filter(|v| !entries.iter().any(|a| matches(a, v)))
        .map(ToString::to_string)
        .collect();
    for entry in &entries {
        assert!(
            !entry.reason.is_empty(),
            "an allow-list entry without a reason"
        );
        if !violations.iter().any(|v| matches(entry, v)) {
            listed.push(format!(
                "{}: the allow-list entry for `{}` matches nothing any more: delete it",
                entry.file, entry.key
            ));
        }
    }
    assert!(
        listed.is_empty(),
        "{rule}: {} violation(s):\n{}",
        listed.len(),
        listed.join("\n")
    );
}

fn assert_clean(rule: &str, violations: Vec<Violation>) {
    assert_clean_with(rule, violations, ALLOWED);
}

// ---------------------------------------------------------------------------------------
// The tree.

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn rust_sources(repo: &Path, dir: &str) -> Vec<Source> {
    let mut sources = Vec::new();
    let mut stack = vec![repo.join(dir)];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                sources.push(Source {
                    path: path
                        .strip_prefix(repo)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                    text: std::fs::read_to_string(&path).unwrap(),
                });
            }
        }
    }
    sources.sort_by(|a, b| a.path.cmp(&b.path));
    sources
}

fn module_dirs(repo: &Path) -> Vec<String> {
    let mut dirs = Vec::new();
    let mut stack = vec![repo.join("host/src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(
                    path.strip_prefix(repo)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
                stack.push(path);
            }
        }
    }
    dirs.sort();
    dirs
}

const STD_CRATES: &[&str] = &["std", "core", "alloc", "proc_macro"];

/// The crates a path in the crate of `manifest` (`host/Cargo.toml`) may start with:
/// std's, and its dependencies (by their library names).
fn externs_of(manifest: &Path) -> BTreeSet<String> {
    let manifest = std::fs::read_to_string(manifest).unwrap();
    let mut externs: BTreeSet<String> = STD_CRATES.iter().map(|c| c.to_string()).collect();
    let mut section = "";
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
            continue;
        }
        if !matches!(section, "[dependencies]" | "[dev-dependencies]") || line.starts_with('#') {
            continue;
        }
        if let Some((name, _)) = line.split_once('=') {
            // hcl-rs is the one whose library is not named after the package.
            let name = match name.trim() {
                "hcl-rs" => "hcl",
                name => name,
            };
            externs.insert(name.replace('-', "_"));
        }
    }
    externs
}

/// The host's source, read once for all the tests.
fn host() -> &'static (Vec<Source>, Analysis) {
    static HOST: OnceLock<(Vec<Source>, Analysis)> = OnceLock::new();
    HOST.get_or_init(|| {
        let repo = repo();
        let sources = rust_sources(&repo, "host/src");
        let analysis = analyze(&Inputs {
            sources: &sources,
            externs: externs_of(&repo.join("host/Cargo.toml")),
            out_dir: None,
            repo: Some(repo.clone()),
        });
        (sources, analysis)
    })
}

/// The source of every crate of `crates/` (the host's is `host()`), for the rules that
/// hold in all the product crates (what a crate's manifest cannot enforce: typed errors,
/// module docs, file sizes, and which module may touch mount syscalls, the runners'
/// privileged calls, the bindings and gRPC). The floors hold in `crates/client`; between
/// crates, Cargo enforces them.
fn crates() -> &'static [(Vec<Source>, Analysis)] {
    static CRATES: OnceLock<Vec<(Vec<Source>, Analysis)>> = OnceLock::new();
    CRATES.get_or_init(|| {
        let repo = repo();
        let mut crates = Vec::new();
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(repo.join("crates"))
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|dir| dir.join("Cargo.toml").is_file())
            .collect();
        dirs.sort();
        for dir in dirs {
            let src = dir.strip_prefix(&repo).unwrap().join("src");
            let sources = rust_sources(&repo, &src.to_string_lossy());
            // The guest components' generated module, which `builtin` includes.
            let out_dir = dir
                .ends_with("crates/builtin")
                .then(|| berth_builtin::OUT_DIR.to_string());
            let analysis = analyze(&Inputs {
                sources: &sources,
                externs: externs_of(&dir.join("Cargo.toml")),
                out_dir,
                repo: Some(repo.clone()),
            });
            crates.push((sources, analysis));
        }
        crates
    })
}

/// `rule`'s violations in every product crate: the host and those of `crates/`.
fn in_every_crate(rule: impl Fn(&[Source], &Analysis) -> Vec<Violation>) -> Vec<Violation> {
    let (sources, analysis) = host();
    let mut violations = rule(sources, analysis);
    for (sources, analysis) in crates() {
        violations.extend(rule(sources, analysis));
    }
    violations
}

fn architecture() -> String {
    std::fs::read_to_string(repo().join("ARCHITECTURE.md")).unwrap()
}

#[test]
fn the_whole_source_is_read() {
    assert_clean(
        "unreadable",
        in_every_crate(|_, analysis| unreadable_source(analysis)),
    );
}

/// The client's source (`crates/client/src`), whose modules stand on the floors.
fn client() -> &'static Analysis {
    crates()
        .iter()
        .find(|(sources, _)| {
            sources
                .iter()
                .any(|s| s.path.starts_with("crates/client/src/"))
        })
        .map(|(_, analysis)| analysis)
        .expect("crates/client is read")
}

#[test]
fn no_module_imports_upward() {
    let floors = parse_floors(&architecture()).unwrap();
    let analysis = client();
    let mut violations = upward_imports(analysis, &floors);
    // Every floor named in the picture is a module that exists.
    for module in floors.keys() {
        let exists = analysis
            .units
            .iter()
            .any(|u| u.krate == Krate::Lib && u.module.first() == Some(module));
        if !exists {
            violations.push(Violation {
                file: "ARCHITECTURE.md".into(),
                line: 1,
                key: module.clone(),
                message: format!(
                    "the Floors block names `{module}`, which is not a module of crates/client/src"
                ),
            });
        }
    }
    assert_clean("floors", violations);
}

#[test]
fn only_mount_calls_mount_syscalls() {
    assert_clean(
        "mount syscalls",
        in_every_crate(|_, analysis| mount_syscalls_outside_mount(analysis)),
    );
}

#[test]
fn runners_reach_privileged_calls_only_through_sys() {
    assert_clean(
        "privileged calls",
        in_every_crate(|_, analysis| privileged_calls_in_runners(analysis)),
    );
}

#[test]
fn only_runtime_touches_wasmtime_bindings() {
    assert_clean(
        "generated bindings",
        in_every_crate(|_, analysis| bindings_outside_runtime(analysis)),
    );
}

#[test]
fn only_csi_touches_grpc() {
    assert_clean(
        "gRPC types",
        in_every_crate(|_, analysis| grpc_outside_csi(analysis)),
    );
}

#[test]
fn nomad_handlers_answer_with_nomad_types() {
    assert_clean(
        "nomad-json",
        in_every_crate(|_, analysis| nomad_json_by_hand(analysis)),
    );
}

#[test]
fn the_cli_prints_only_through_output() {
    assert_clean("cli-prints", cli_prints_outside_output(&host().1));
}

/// `anyhow` only in the CLI and the binaries (the `berth` package, `host/`): everywhere
/// else errors are typed. The manifests say it: no other crate may name `anyhow`.
#[test]
fn only_the_cli_depends_on_anyhow() {
    let repo = repo();
    let mut manifests: Vec<PathBuf> = std::fs::read_dir(repo.join("crates"))
        .unwrap()
        .map(|entry| entry.unwrap().path().join("Cargo.toml"))
        .filter(|manifest| manifest.is_file())
        .collect();
    manifests.push(repo.join("host/Cargo.toml"));
    let with_anyhow: Vec<String> = manifests
        .iter()
        .filter(|manifest| externs_of(manifest).contains("anyhow"))
        .map(|manifest| manifest.strip_prefix(&repo).unwrap().display().to_string())
        .collect();
    assert_eq!(with_anyhow, vec!["host/Cargo.toml".to_string()]);
}

#[test]
fn errors_are_typed() {
    assert_clean(
        "typed errors",
        in_every_crate(|_, analysis| untyped_errors(analysis)),
    );
}

#[test]
fn error_types_derive_thiserror() {
    assert_clean(
        "thiserror",
        in_every_crate(|_, analysis| error_types_without_thiserror(analysis)),
    );
}

#[test]
fn no_circles_inside_a_folder() {
    assert_clean(
        "circles",
        in_every_crate(|_, analysis| folder_circles(analysis)),
    );
}

#[test]
fn no_file_is_too_long() {
    assert_clean(
        "file size",
        in_every_crate(|sources, _| oversized_files(sources)),
    );
}

#[test]
fn every_module_says_what_it_is_for() {
    assert_clean(
        "module docs",
        in_every_crate(|_, analysis| missing_module_doc(analysis)),
    );
}

#[test]
fn every_invariant_names_the_test_that_holds_it() {
    let repo = repo();
    let mut sources = Vec::new();
    for dir in ["crates", "host", "tests", "plugins-sdk", "drivers"] {
        sources.extend(rust_sources(&repo, dir));
    }
    assert_clean(
        "invariants",
        invariants_without_tests(&architecture(), &sources),
    );
}

#[test]
fn architecture_names_every_module_directory() {
    let repo = repo();
    let violations = architecture_map(&architecture(), &module_dirs(&repo), |path| {
        repo.join(path).exists()
    });
    assert_clean("ARCHITECTURE.md", violations);
}

// ---------------------------------------------------------------------------------------
// The checker's own tests: each rule catches what it names, on planted source.

fn source(path: &str, text: &str) -> Source {
    Source {
        path: path.into(),
        text: text.into(),
    }
}

fn planted(files: &[(&str, &str)]) -> Analysis {
    let sources: Vec<Source> = files
        .iter()
        .map(|(path, text)| source(path, text))
        .collect();
    let externs = [
        "std",
        "core",
        "alloc",
        "anyhow",
        "berth_proto",
        "berth_runtime",
        "berth_sys",
        "hcl",
        "libc",
        "nix",
        "prost",
        "rustix",
        "serde",
        "serde_json",
        "thiserror",
        "tokio",
        "tonic",
        "wasmtime",
    ];
    analyze(&Inputs {
        sources: &sources,
        externs: externs.iter().map(|c| c.to_string()).collect(),
        out_dir: None,
        repo: None,
    })
}

fn floors_of(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
    pairs.iter().map(|(m, f)| (m.to_string(), *f)).collect()
}

fn lines_of(violations: &[Violation]) -> Vec<usize> {
    violations.iter().map(|v| v.line).collect()
}

fn test_floors() -> BTreeMap<String, usize> {
    floors_of(&[
        ("blocking", 0),
        ("mount", 1),
        ("state", 2),
        ("csi", 4),
        ("driver_set", 4),
        ("validate", 5),
        ("task_runner", 6),
        ("alloc_runner", 7),
        ("agent", 8),
    ])
}

#[test]
fn checker_catches_an_upward_import() {
    let upward = planted(&[(
        "host/src/state/mod.rs",
        "//! state\nuse crate::blocking::block;\nuse crate::alloc_runner::AllocStatus;\n",
    )]);
    assert_eq!(
        upward_imports(&upward, &test_floors()),
        vec![Violation {
            file: "host/src/state/mod.rs".into(),
            line: 3,
            key: "crate::alloc_runner".into(),
            message: "`state` (floor 2) imports `crate::alloc_runner` (floor 7, on a higher floor): move the shared part down (often into `model`)".into(),
        }]
    );
}

#[test]
fn checker_follows_use_groups() {
    let grouped = planted(&[(
        "host/src/state/records.rs",
        "//! records\n\
         use crate::{alloc_runner::X};\n\
         use crate::{\n\
             blocking::block,\n\
             agent::{self, launch::{Launch}},\n\
         };\n\
         use crate::{blocking::{inner::{Deep}}};\n",
    )]);
    let found = upward_imports(&grouped, &test_floors());
    assert_eq!(lines_of(&found), vec![2, 5], "{found:#?}");
    assert_eq!(found[0].key, "crate::alloc_runner");
    assert_eq!(found[1].key, "crate::agent");
}

#[test]
fn checker_follows_super_chains() {
    // `super::super` from state/records.rs is the crate root.
    let chained = planted(&[
        (
            "host/src/state/records.rs",
            "//! records\n\
             use super::super::alloc_runner::AllocRunner;\n\
             use super::StateStore;\n\
             fn f() { super::super::agent::start(); }\n\
             fn g() -> super::super::super::Nowhere { todo!() }\n\
             mod inner { use super::super::super::agent::Agent; }\n",
        ),
        (
            "host/src/csi/client.rs",
            "//! client\nuse super::super::state::StateStore;\nuse super::layout::PluginDirs;\n",
        ),
    ]);
    let found = upward_imports(&chained, &test_floors());
    let seen: Vec<(usize, &str)> = found.iter().map(|v| (v.line, v.key.as_str())).collect();
    assert_eq!(
        seen,
        vec![
            (2, "crate::alloc_runner"),
            (4, "crate::agent"),
            (5, "super::"),
            (6, "crate::agent")
        ]
    );
    // From csi/client.rs, `super::super::state` is `crate::state`, `super::layout` is
    // `crate::csi::layout`.
    let client = chained
        .units
        .iter()
        .find(|u| u.label == "host/src/csi/client.rs")
        .unwrap();
    let targets: Vec<String> = client.refs.iter().map(|r| r.target.to_string()).collect();
    assert_eq!(
        targets,
        vec!["crate::state::StateStore", "crate::csi::layout::PluginDirs"]
    );
}

#[test]
fn checker_ignores_comments_strings_and_docs_but_not_inline_paths() {
    let ground = planted(&[(
        "host/src/blocking/x.rs",
        "//! x, see crate::agent\n\
         /* use crate::agent::Agent; */\n\
         /*\n\
          * use crate::alloc_runner::AllocRunner;\n\
          */\n\
         /// Made by crate::agent::Agent.\n\
         fn f() -> &'static str { \"crate::agent\" } // crate::agent\n\
         fn g() { crate::state::open(); }\n\
         fn h() -> Vec<crate::state::Record> { vec![] }\n\
         fn i() { println!(\"{}\", crate::state::NAME); }\n\
         fn j() { tokio::select! { _ = crate::agent::run() => {} } }\n",
    )]);
    let found = upward_imports(&ground, &test_floors());
    let seen: Vec<(usize, &str)> = found.iter().map(|v| (v.line, v.key.as_str())).collect();
    assert_eq!(
        seen,
        vec![
            (8, "crate::state"),
            (9, "crate::state"),
            (10, "crate::state"),
            (11, "crate::agent")
        ]
    );
}

#[test]
fn checker_follows_names_a_glob_brings_in_and_flags_a_glob_of_the_crate_root() {
    let globbed = planted(&[
        (
            "host/src/state/mod.rs",
            "//! s\nuse crate::agent::Agent;\nmod tests {\n    use super::*;\n    fn f() -> Agent { todo!() }\n}\n",
        ),
        ("host/src/validate.rs", "//! v\nuse super::*;\n"),
    ]);
    let found = upward_imports(&globbed, &test_floors());
    let seen: Vec<(&str, usize, &str)> = found
        .iter()
        .map(|v| (v.file.as_str(), v.line, v.key.as_str()))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("host/src/state/mod.rs", 2, "crate::agent"),
            ("host/src/state/mod.rs", 5, "crate::agent"),
            ("host/src/validate.rs", 2, "crate::*"),
        ]
    );
}

#[test]
fn checker_catches_a_same_floor_import_and_a_module_without_a_floor() {
    let floors = floors_of(&[("csi", 4), ("driver_set", 4)]);
    let sideways = planted(&[("host/src/csi/mod.rs", "use crate::driver_set::DriverSet;\n")]);
    assert!(
        upward_imports(&sideways, &floors)[0]
            .message
            .contains("on the same floor")
    );
    let homeless = planted(&[("host/src/newthing.rs", "//! new\n")]);
    assert!(
        upward_imports(&homeless, &floors)[0]
            .message
            .contains("stands on no floor")
    );
    let downward = planted(&[(
        "host/src/csi/mod.rs",
        "use crate::csi::client::CsiClient;\n",
    )]);
    assert!(upward_imports(&downward, &floors).is_empty());
}

#[test]
fn checker_reads_included_files_as_part_of_their_module() {
    let including = planted(&[
        (
            "host/src/state/mod.rs",
            "//! s\nmod generated {\n    include!(\"generated.rs\");\n}\n",
        ),
        (
            "host/src/state/generated.rs",
            "pub const X: u8 = 1;\nuse crate::alloc_runner::AllocRunner;\n",
        ),
    ]);
    let found = upward_imports(&including, &test_floors());
    assert_eq!(
        found
            .iter()
            .map(|v| (v.file.as_str(), v.line))
            .collect::<Vec<_>>(),
        vec![("host/src/state/generated.rs", 2)]
    );
    // The included file is no module of its own: it needs no `//!`.
    assert!(missing_module_doc(&including).is_empty());
    assert!(unreadable_source(&including).is_empty());

    // An include the checker cannot follow is reported, as is one in an expression.
    let unfollowed = planted(&[(
        "host/src/builtin.rs",
        "//! b\nmod guests {\n    include!(concat!(env!(\"OUT_DIR\"), \"/guests.rs\"));\n}\nfn f() -> u8 { include!(\"value.rs\") }\n",
    )]);
    let found = unreadable_source(&unfollowed);
    assert_eq!(lines_of(&found), vec![3, 5], "{found:#?}");
}

#[test]
fn checker_catches_mount_syscalls_elsewhere() {
    let elsewhere = planted(&[(
        "host/src/csi/layout.rs",
        "use rustix::mount::MountPropagationFlags;\n\
         fn f() { rustix::mount::mount_bind(a, b)?; }\n\
         use rustix::mount::{mount_change, MountFlags};\n\
         fn g() { unsafe { libc::umount2(p, 0) }; }\n\
         use rustix::mount;\n\
         use rustix::mount::{MountFlags, UnmountFlags};\n\
         fn h() { unsafe { libc::syscall(libc::SYS_move_mount, 0) }; }\n\
         /* rustix::mount::mount_bind(a, b) */ const X: &str = \"libc::mount\";\n\
         fn i() { berth_sys::mount::open_tree(p); }\n\
         use nix::mount::mount as m;\n",
    )]);
    assert_eq!(
        lines_of(&mount_syscalls_outside_mount(&elsewhere)),
        vec![2, 3, 4, 5, 7, 10]
    );
    let inside = planted(&[(
        "crates/sys/src/mount/shared.rs",
        "fn f() { rustix::mount::mount_bind(a, b)?; }\n",
    )]);
    assert!(mount_syscalls_outside_mount(&inside).is_empty());
}

#[test]
fn checker_catches_privileged_calls_in_runners() {
    let runner = planted(&[(
        "crates/client/src/task_runner/volumes_hook.rs",
        "use berth_sys::cgroup::Cgroups;\n\
         fn f() { rustix::fs::fchown(&dir, None, None)?; }\n\
         fn g() { berth_sys::process::users::lookup(\"nobody\"); }\n\
         fn h() { berth_sys::cgroup::Cgroups::task_name(a, t); }\n\
         fn i() { unsafe { libc::setrlimit(0, &l) }; }\n",
    )]);
    assert_eq!(
        lines_of(&privileged_calls_in_runners(&runner)),
        vec![1, 2, 3, 5]
    );
    let seam = planted(&[(
        "crates/sys/src/linux.rs",
        "fn f() { rustix::fs::fchown(&dir, None, None)?; }\n",
    )]);
    assert!(privileged_calls_in_runners(&seam).is_empty());
}

#[test]
fn checker_catches_bindings_and_grpc_elsewhere() {
    let elsewhere = planted(&[
        (
            "crates/client/src/validate.rs",
            "use berth_runtime::bindings::driver_types;\nfn f() -> wasmtime::Result<()> { Ok(()) }\nuse wasmtime::component::bindgen;\n",
        ),
        (
            "crates/client/src/agent/mod.rs",
            "fn f() -> tonic::Status { todo!() }\n\
             use berth_proto::csi as pb;\n\
             fn g(volume: pb::Volume) {}\n\
             fn h() { println!(\"{:?}\", tonic::Code::Ok); }\n\
             const S: &str = \"tonic::Code\"; // prost::Message\n\
             #[derive(prost::Message)]\n\
             struct M;\n",
        ),
        ("crates/csi/src/client.rs", "use tonic::Code;\n"),
        (
            "crates/runtime/src/bindings.rs",
            "wasmtime::component::bindgen!({ world: \"plugin\" });\n",
        ),
    ]);
    let bindings = bindings_outside_runtime(&elsewhere);
    assert_eq!(lines_of(&bindings), vec![1, 2, 3], "{bindings:#?}");
    let grpc = grpc_outside_csi(&elsewhere);
    assert!(
        grpc.iter()
            .all(|v| v.file == "crates/client/src/agent/mod.rs")
    );
    assert_eq!(lines_of(&grpc), vec![1, 2, 3, 4, 6], "{grpc:#?}");
}

#[test]
fn checker_catches_cli_prints_outside_output() {
    let planted_cli = planted(&[
        (
            "host/src/cli/volume.rs",
            "//! v\n\
             use super::output::print_line;\n\
             fn f(v: &V) {\n\
             println!(\"{}\", v.name);\n\
             print_line!(\"{}\", v.name);\n\
             print_line!(\"{name} {{literal}}\", v.id);\n\
             let _ = std::io::stdout();\n\
             eprint_line!(\"{:?} {{}}\", v.id);\n\
             let s = format!(\"{}\", v.name);\n\
             }\n\
             #[cfg(test)]\nmod tests { fn t() { println!(\"test output\"); } }\n",
        ),
        (
            "host/src/cli/output.rs",
            "//! o\nfn g(t: &str) { println!(\"{t}\"); let _ = std::io::stdout(); }\n",
        ),
        (
            "host/src/agent/mod.rs",
            "//! a\nfn h() { println!(\"not the CLI\"); }\n",
        ),
    ]);
    let found = cli_prints_outside_output(&planted_cli);
    assert!(
        found.iter().all(|v| v.file == "host/src/cli/volume.rs"),
        "{found:#?}"
    );
    // println! (4), a variable named in the format string (6), stdout (7).
    assert_eq!(lines_of(&found), vec![4, 6, 7], "{found:#?}");
    assert_eq!(found[1].key, "{name}");
}

#[test]
fn checker_catches_nomad_json_built_by_hand() {
    let planted_api = planted(&[
        (
            "crates/api/src/nomad/jobs.rs",
            "//! j\n\
             fn f(id: &str) -> serde_json::Value {\n\
             serde_json::json!({\"ID\": id})\n\
             }\n\
             #[cfg(test)]\nmod tests { fn t() { let _ = serde_json::json!({}); } }\n",
        ),
        (
            "crates/client/src/consul/api.rs",
            "//! c\nfn g() { let _ = serde_json::json!({\"Name\": 1}); }\n",
        ),
    ]);
    let found = nomad_json_by_hand(&planted_api);
    assert_eq!(lines_of(&found), vec![3], "{found:#?}");
    assert_eq!(found[0].file, "crates/api/src/nomad/jobs.rs");
}

#[test]
fn checker_catches_an_invariant_without_a_test() {
    let architecture = "# A\n\n## Invariants\n\n\
        - Held (`jobs::a_real_test`).\n\
        - Held by a module of tests (`alloc_runner::tests`), over\n  two lines.\n\
        - Said, and held by nothing.\n\
        - Held by a test that is gone (`jobs::a_renamed_test`).\n\n\
        Checked by `host/tests/floors.rs` on the syntax tree:\n\n- Not an invariant.\n";
    let sources = [
        source("tests/e2e/jobs.rs", "async fn a_real_test() {}\n"),
        source(
            "crates/client/src/alloc_runner/mod.rs",
            "#[cfg(test)]\nmod tests;\n",
        ),
    ];
    let found = invariants_without_tests(architecture, &sources);
    assert_eq!(lines_of(&found), vec![8, 9], "{found:#?}");
    assert_eq!(found[1].key, "a_renamed_test");
}

#[test]
fn checker_catches_untyped_errors() {
    let untyped = planted(&[
        (
            "host/src/jobspec/decode.rs",
            "//! d\n\
             pub fn parse(text: &str) -> Result<u32, String> {}\n\
             fn ok() -> Result<Option<(String, HashMap<String, String>)>, Error> {}\n\
             impl Host for Ctx { fn wit(&mut self) -> wasmtime::Result<Result<(), String>> {} }\n\
             type R = std::result::Result<hcl::Value, String>;\n\
             fn boxed() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {}\n\
             fn text() -> Result<(), &'static str> {}\n\
             struct S { f: Box<dyn Fn() -> std::result::Result<u8, String>> }\n\
             fn typed() -> Result<(), Box<DecodeError>> {}\n\
             #[cfg(test)]\n\
             fn t() -> Result<(), String> {}\n\
             #[cfg(test)]\n\
             mod tests;\n",
        ),
        (
            "host/src/jobspec/mod.rs",
            "//! j\n#[cfg(test)]\nmod tests;\n",
        ),
        (
            "host/src/jobspec/tests.rs",
            "fn t() -> Result<(), String> {}\n",
        ),
    ]);
    let found = untyped_errors(&untyped);
    let seen: Vec<(usize, &str)> = found.iter().map(|v| (v.line, v.key.as_str())).collect();
    assert_eq!(
        seen,
        vec![(2, "parse"), (6, "boxed"), (7, "text"), (8, "S")],
        "{found:#?}"
    );
    assert!(
        found[0]
            .message
            .starts_with("`Result<_, String>` in `parse`")
    );
    assert!(found[1].message.starts_with("`Result<_, Box<dyn Error>>`"));
}

#[test]
fn checker_catches_error_types_without_thiserror() {
    let errors = planted(&[
        (
            "host/src/state/mod.rs",
            "use thiserror::Error;\n\
             #[derive(Debug, thiserror::Error)] #[error(\"a\")] pub enum AError { A }\n\
             #[derive(Debug, Error)] #[error(\"b\")] pub struct BError;\n\
             #[derive(Debug)] pub struct CError;\n\
             pub struct DError(String);\n\
             #[derive(Debug, Clone)] pub enum NotAFailure { A }\n\
             #[cfg(test)] #[derive(Debug)] struct TestError;\n",
        ),
        (
            "host/src/catalog/mod.rs",
            "use std::error::Error;\n#[derive(Debug, Error)]\npub struct EError;\n",
        ),
    ]);
    let found = error_types_without_thiserror(&errors);
    let seen: Vec<(&str, usize)> = found.iter().map(|v| (v.key.as_str(), v.line)).collect();
    assert_eq!(seen, vec![("CError", 4), ("DError", 5), ("EError", 3)]);
}

#[test]
fn checker_catches_a_circle_inside_a_folder() {
    let circled = planted(&[
        (
            "host/src/task_runner/mod.rs",
            "//! t\nmod hooks;\nmod env_hook;\nmod fine;\npub use hooks::HookError;\npub struct TaskRunner;\n",
        ),
        (
            "host/src/task_runner/hooks.rs",
            "//! h\nuse super::env_hook::EnvHook;\npub struct HookError;\n",
        ),
        (
            "host/src/task_runner/env_hook.rs",
            "//! e\nuse crate::task_runner::HookError;\nuse super::TaskRunner;\npub struct EnvHook;\n",
        ),
        (
            "host/src/task_runner/fine.rs",
            "//! f\nuse super::hooks::HookError;\nuse super::TaskRunner;\n",
        ),
        // A folder's sub-folder is one of its nodes.
        (
            "host/src/runtime/mod.rs",
            "mod sandbox;\nmod host_api;\nmod cache;\n",
        ),
        (
            "host/src/runtime/sandbox.rs",
            "pub struct PluginCtx { log: crate::runtime::host_api::log::LogBudget }\n",
        ),
        ("host/src/runtime/host_api/mod.rs", "pub mod log;\n"),
        (
            "host/src/runtime/host_api/log.rs",
            "use crate::runtime::sandbox::PluginCtx;\npub struct LogBudget;\n",
        ),
        (
            "host/src/runtime/cache.rs",
            "use super::sandbox::PluginCtx;\n",
        ),
    ]);
    let found = folder_circles(&circled);
    let seen: Vec<(&str, usize, &str)> = found
        .iter()
        .map(|v| (v.file.as_str(), v.line, v.key.as_str()))
        .collect();
    assert_eq!(
        seen,
        vec![
            (
                "host/src/runtime/host_api/log.rs",
                1,
                "host_api <-> sandbox"
            ),
            ("host/src/task_runner/env_hook.rs", 2, "env_hook <-> hooks"),
        ],
        "{found:#?}"
    );
    assert!(found[1].message.contains(
        "host/src/task_runner/env_hook.rs:2 imports `hooks`, host/src/task_runner/hooks.rs:2 imports `env_hook`"
    ));
}

#[test]
fn circles_are_walked_through_every_member() {
    let edges: Vec<(String, String)> = [("a", "b"), ("b", "a"), ("b", "c"), ("c", "b"), ("d", "a")]
        .iter()
        .map(|(from, to)| (from.to_string(), to.to_string()))
        .collect();
    let found = circles(edges.iter());
    assert_eq!(found, vec![vec!["a", "b", "c", "b"]]);
    // Every step of the walk is an edge.
    for circle in &found {
        for (from, to) in circle.iter().zip(circle.iter().cycle().skip(1)) {
            assert!(
                edges.contains(&(from.clone(), to.clone())),
                "{from} -> {to}"
            );
        }
    }
    let acyclic: Vec<(String, String)> = vec![("a".into(), "b".into()), ("b".into(), "c".into())];
    assert!(circles(acyclic.iter()).is_empty());
}

#[test]
fn checker_catches_a_long_file_and_the_allow_list_only_shrinks() {
    let sources = vec![
        source("host/src/big.rs", &"x\n".repeat(MAX_LINES + 1)),
        source("host/src/fits.rs", &"x\n".repeat(MAX_LINES)),
    ];
    let found = oversized_files(&sources);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].file, "host/src/big.rs");
    let allowed = [Allowed {
        rule: "file size",
        file: "host/src/big.rs",
        key: "size",
        reason: "one responsibility",
    }];
    assert_clean_with("file size", found.clone(), &allowed);
    let unlisted = std::panic::catch_unwind(|| assert_clean_with("file size", found.clone(), &[]));
    assert!(unlisted.is_err());
    let stale = std::panic::catch_unwind(|| assert_clean_with("file size", Vec::new(), &allowed));
    assert!(stale.is_err());
}

#[test]
fn checker_catches_missing_docs_and_unparsable_files() {
    let undocumented = planted(&[
        ("host/src/x.rs", "use a;\n"),
        ("host/src/y.rs", "#![allow(dead_code)]\n//! late\n"),
        ("host/src/z.rs", "//! fine\nuse a;\n"),
    ]);
    let files: Vec<String> = missing_module_doc(&undocumented)
        .into_iter()
        .map(|v| v.file)
        .collect();
    assert_eq!(files, vec!["host/src/x.rs", "host/src/y.rs"]);
    let broken = planted(&[("host/src/x.rs", "//! x\nfn f( {\n")]);
    assert_eq!(unreadable_source(&broken).len(), 1);
}

#[test]
fn checker_catches_a_stale_architecture_map() {
    let architecture = "## Code map\n### `host/src/csi/`\nSee `host/src/gone.rs`.\n";
    let dirs = vec!["host/src/csi".to_string(), "host/src/model".to_string()];
    let found = architecture_map(architecture, &dirs, |path| path != "host/src/gone.rs");
    let messages: Vec<&str> = found.iter().map(|v| v.message.as_str()).collect();
    assert_eq!(
        messages,
        vec![
            "the module directory `host/src/model/` is not in the code map",
            "`host/src/gone.rs` does not exist"
        ]
    );
}

#[test]
fn floors_are_read_from_the_picture() {
    let architecture =
        "# A\n## Floors\n\n```text\nfloor 2  agent\nfloor 1  csi, state\nfloor 0  model\n```\n";
    assert_eq!(
        parse_floors(architecture).unwrap(),
        floors_of(&[("agent", 2), ("csi", 1), ("state", 1), ("model", 0)])
    );
    assert!(parse_floors("## Floors\n```text\nfloor 1 a\nfloor 2 a\n```\n").is_err());
    assert!(parse_floors("no floors here").is_err());
}

#[test]
fn the_planted_floors_agree_with_the_real_ones() {
    // The planted tests' floors agree with the picture where they overlap (`blocking`
    // and `mount` are modules of `berth-sys` now, `state` and `csi` crates of their
    // own, under every floor).
    let real = parse_floors(&architecture()).unwrap();
    assert!(real["validate"] < real["alloc_runner"]);
    let overlap: Vec<(String, usize)> = test_floors()
        .into_iter()
        .filter(|(module, _)| real.contains_key(module))
        .collect();
    assert!(overlap.len() >= 5, "{overlap:?}");
    for (module, floor) in &overlap {
        let real_floor = real[module];
        for (other, other_floor) in &overlap {
            assert_eq!(
                floor.cmp(other_floor),
                real_floor.cmp(&real[other]),
                "{module} and {other}"
            );
        }
    }
}
