//! Go's `text/template` syntax, read into a tree: text, actions with pipelines, `if`,
//! `with`, `range` (with `else`, `else if`, `else with`, `break` and `continue`),
//! variables, `define`, `template` and `block`, comments and the `{{-`/`-}}` trims,
//! with the delimiters the template names. Every function named is checked here,
//! against [`crate::functions`]: an unknown or unsupported one is refused before
//! anything runs, as Go's parser refuses an undefined function.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::functions::{self, Support};
use crate::lex::{Tok, Token, lex};

/// Why a template cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

/// The delimiters of actions: `{{` and `}}` unless a template names others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delimiters {
    pub left: String,
    pub right: String,
}

impl Default for Delimiters {
    fn default() -> Self {
        Delimiters {
            left: "{{".into(),
            right: "}}".into(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) enum Node {
    Text(Arc<str>),
    Action {
        pipe: Pipe,
    },
    /// `if` and `with`, their `else if`/`else with` chain flattened into branches.
    Branches {
        with: bool,
        branches: Vec<(Pipe, Vec<Node>)>,
        otherwise: Vec<Node>,
    },
    Range {
        line: usize,
        pipe: Pipe,
        body: Vec<Node>,
        otherwise: Vec<Node>,
    },
    Template {
        line: usize,
        name: String,
        pipe: Option<Pipe>,
    },
    Break,
    Continue,
}

#[derive(Debug, Clone)]
pub(crate) struct Pipe {
    pub line: usize,
    /// `$x :=` (or `$i, $e :=` in a range); empty: no declaration.
    pub declare: Vec<Arc<str>>,
    /// `$x =`: an assignment to a variable declared before.
    pub assign: bool,
    pub commands: Vec<Command>,
}

#[derive(Debug, Clone)]
pub(crate) struct Command {
    pub args: Vec<Operand>,
}

#[derive(Debug, Clone)]
pub(crate) enum Operand {
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Arc<str>),
    /// `.`
    Dot,
    /// `.A.B`
    Field(Vec<String>),
    /// `$x.A.B` (`$` alone is the data the template was given).
    Variable(Arc<str>, Vec<String>),
    Function(&'static str, Support),
    /// `(pipeline).A.B`
    Nested(Box<Pipe>, Vec<String>),
}

/// Most nesting of `if`/`range`/`with` and parentheses a template may have.
const MAX_NESTING: usize = 100;

/// A parsed template: its main tree and the templates it defines.
#[derive(Debug, Clone)]
pub struct Parsed {
    pub(crate) main: Vec<Node>,
    pub(crate) defined: BTreeMap<String, Arc<Vec<Node>>>,
    /// The functions the template calls, each once.
    pub(crate) calls: Vec<&'static str>,
}

impl Parsed {
    /// The functions the template calls: what a renderer must be able to answer.
    pub fn functions(&self) -> &[&'static str] {
        &self.calls
    }
}

/// Reads a template; every problem is one [`ParseError`] with its line.
pub fn parse(text: &str, delimiters: &Delimiters) -> Result<Parsed, ParseError> {
    if delimiters.left.is_empty() || delimiters.right.is_empty() {
        return Err(ParseError {
            line: 1,
            message: "a delimiter cannot be empty".into(),
        });
    }
    let tokens = lex(text, delimiters)?;
    let mut parser = Parser {
        tokens,
        at: 0,
        defined: BTreeMap::new(),
        calls: Vec::new(),
        scopes: vec![vec!["$".to_string()]],
        in_scope: std::collections::HashMap::from([("$".to_string(), 1)]),
        depth: 0,
        loops: 0,
    };
    let (main, end) = parser.list_until(true)?;
    if let Some((word, line, _)) = end {
        return Err(ParseError {
            line,
            message: format!("unexpected {{{{{word}}}}}"),
        });
    }
    Ok(Parsed {
        main,
        defined: parser.defined,
        calls: parser.calls,
    })
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
    defined: BTreeMap<String, Arc<Vec<Node>>>,
    calls: Vec<&'static str>,
    /// Declared variables, per control structure.
    scopes: Vec<Vec<String>>,
    /// How many scopes declare each name: a lookup, not a scan of every scope.
    in_scope: std::collections::HashMap<String, usize>,
    depth: usize,
    /// `range`s the parser is inside (for `break` and `continue`).
    loops: usize,
}

/// What ended a list: `end`, `else` (with what follows it on the line), with its line.
type Ending = (String, usize, Vec<Token>);

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        token
    }

    fn line(&self) -> usize {
        self.peek()
            .or_else(|| self.tokens.last())
            .map_or(1, |t| t.line)
    }

    fn error(&self, line: usize, message: impl Into<String>) -> ParseError {
        ParseError {
            line,
            message: message.into(),
        }
    }

    /// Nodes up to an `{{end}}` or `{{else …}}` (returned with the tokens after
    /// `else`) or, at the top, the end of the text.
    fn list_until(&mut self, top: bool) -> Result<(Vec<Node>, Option<Ending>), ParseError> {
        let mut nodes = Vec::new();
        while let Some(token) = self.next() {
            match token.tok {
                Tok::Text(text) => nodes.push(Node::Text(text.into())),
                Tok::Open => {
                    let line = token.line;
                    let keyword = match self.peek() {
                        Some(Token {
                            tok: Tok::Ident(word),
                            ..
                        }) => Some(word.clone()),
                        _ => None,
                    };
                    match keyword.as_deref() {
                        Some("end") => {
                            self.at += 1;
                            self.close()?;
                            return Ok((nodes, Some(("end".into(), line, Vec::new()))));
                        }
                        Some("else") => {
                            self.at += 1;
                            // `else if …` leaves its condition in the stream, for the
                            // `if` to read where it stands (no copying: linear).
                            let follows = match self.peek() {
                                Some(Token {
                                    tok: Tok::Close, ..
                                }) => {
                                    self.at += 1;
                                    Vec::new()
                                }
                                Some(token) => vec![token.clone()],
                                None => Vec::new(),
                            };
                            return Ok((nodes, Some(("else".into(), line, follows))));
                        }
                        Some("if") | Some("with") => {
                            let with = keyword.as_deref() == Some("with");
                            self.at += 1;
                            nodes.push(self.branches(line, with)?);
                        }
                        Some("range") => {
                            self.at += 1;
                            nodes.push(self.range(line)?);
                        }
                        Some("define") => {
                            self.at += 1;
                            if !top || self.depth > 0 {
                                return Err(self.error(
                                    line,
                                    "define is allowed only at the top of a template",
                                ));
                            }
                            let name = self.name(line, "define")?;
                            self.close()?;
                            self.push_scope(vec!["$".into()]);
                            let body = self.body(line, "define")?;
                            self.pop_scope();
                            self.defined.insert(name, Arc::new(body));
                        }
                        Some("block") => {
                            self.at += 1;
                            let name = self.name(line, "block")?;
                            let pipe = self.pipeline(line, true)?;
                            self.push_scope(vec!["$".into()]);
                            let body = self.body(line, "block")?;
                            self.pop_scope();
                            self.defined.insert(name.clone(), Arc::new(body));
                            nodes.push(Node::Template {
                                line,
                                name,
                                pipe: Some(pipe),
                            });
                        }
                        Some("template") => {
                            self.at += 1;
                            let name = self.name(line, "template")?;
                            let pipe = if matches!(
                                self.peek(),
                                Some(Token {
                                    tok: Tok::Close,
                                    ..
                                })
                            ) {
                                self.at += 1;
                                None
                            } else {
                                Some(self.pipeline(line, true)?)
                            };
                            nodes.push(Node::Template { line, name, pipe });
                        }
                        Some(word @ ("break" | "continue")) => {
                            if self.loops == 0 {
                                return Err(self
                                    .error(line, format!("{{{{{word}}}}} outside {{{{range}}}}")));
                            }
                            let node = if word == "break" {
                                Node::Break
                            } else {
                                Node::Continue
                            };
                            self.at += 1;
                            self.close()?;
                            nodes.push(node);
                        }
                        _ => {
                            let pipe = self.pipeline(line, true)?;
                            nodes.push(Node::Action { pipe });
                        }
                    }
                }
                other => {
                    return Err(self.error(token.line, format!("unexpected {other:?}")));
                }
            }
        }
        if top {
            Ok((nodes, None))
        } else {
            Err(self.error(
                self.line(),
                "unexpected end of the template: an {{end}} is missing",
            ))
        }
    }

    fn close(&mut self) -> Result<(), ParseError> {
        match self.next() {
            Some(Token {
                tok: Tok::Close, ..
            }) => Ok(()),
            Some(token) => Err(self.error(
                token.line,
                format!("unexpected {:?} before the end of the action", token.tok),
            )),
            None => Err(self.error(self.line(), "an action is never closed")),
        }
    }

    fn name(&mut self, line: usize, keyword: &str) -> Result<String, ParseError> {
        match self.next() {
            Some(Token {
                tok: Tok::Str(name),
                ..
            }) => Ok(name),
            _ => Err(self.error(
                line,
                format!("{keyword} takes a quoted name, as {{{{{keyword} \"name\"}}}}"),
            )),
        }
    }

    fn enter(&mut self, line: usize) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return Err(self.error(
                line,
                format!("more than {MAX_NESTING} nested blocks or parentheses"),
            ));
        }
        Ok(())
    }

    /// A body that must end with `{{end}}` (define, block).
    fn body(&mut self, line: usize, keyword: &str) -> Result<Vec<Node>, ParseError> {
        self.enter(line)?;
        let (nodes, ending) = self.list_until(false)?;
        self.depth -= 1;
        match ending {
            Some((word, _, _)) if word == "end" => Ok(nodes),
            _ => Err(self.error(
                line,
                format!("{{{{{keyword}}}}} has an {{{{else}}}}; it takes none"),
            )),
        }
    }

    fn branches(&mut self, line: usize, with: bool) -> Result<Node, ParseError> {
        self.enter(line)?;
        let mut branches = Vec::new();
        let mut otherwise = Vec::new();
        let mut condition_line = line;
        loop {
            self.push_scope(Vec::new());
            let pipe = self.pipeline(condition_line, true)?;
            let (body, ending) = self.list_until(false)?;
            self.pop_scope();
            branches.push((pipe, body));
            match ending {
                Some((word, _, _)) if word == "end" => break,
                Some((_, else_line, after)) => {
                    let keyword = if with { "with" } else { "if" };
                    match after.first() {
                        None => {
                            self.push_scope(Vec::new());
                            let (body, ending) = self.list_until(false)?;
                            self.pop_scope();
                            otherwise = body;
                            if !matches!(ending, Some((ref word, _, _)) if word == "end") {
                                return Err(self.error(else_line, "a second {{else}}"));
                            }
                            break;
                        }
                        Some(Token {
                            tok: Tok::Ident(word),
                            ..
                        }) if word == keyword => {
                            // `else if …`: its condition follows in the stream.
                            self.at += 1;
                            condition_line = else_line;
                        }
                        Some(token) => {
                            return Err(self.error(
                                else_line,
                                format!(
                                    "{{{{else}}}} may be followed only by {keyword}, not {:?}",
                                    token.tok
                                ),
                            ));
                        }
                    }
                }
                None => unreachable!("list_until(false) ends with end or else"),
            }
        }
        self.depth -= 1;
        Ok(Node::Branches {
            with,
            branches,
            otherwise,
        })
    }

    fn range(&mut self, line: usize) -> Result<Node, ParseError> {
        self.enter(line)?;
        self.push_scope(Vec::new());
        let pipe = self.pipeline(line, true)?;
        self.loops += 1;
        let (body, ending) = self.list_until(false)?;
        self.loops -= 1;
        self.pop_scope();
        let otherwise = match ending {
            Some((word, _, _)) if word == "end" => Vec::new(),
            Some((_, else_line, after)) => {
                if !after.is_empty() {
                    return Err(self.error(else_line, "{{else}} of a range takes nothing after it"));
                }
                self.push_scope(Vec::new());
                let (body, ending) = self.list_until(false)?;
                self.pop_scope();
                if !matches!(ending, Some((ref word, _, _)) if word == "end") {
                    return Err(self.error(else_line, "a second {{else}}"));
                }
                body
            }
            None => unreachable!("list_until(false) ends with end or else"),
        };
        self.depth -= 1;
        Ok(Node::Range {
            line,
            pipe,
            body,
            otherwise,
        })
    }

    fn declared(&self, name: &str) -> bool {
        self.in_scope.get(name).is_some_and(|count| *count > 0)
    }

    fn declare(&mut self, name: &str) {
        if let Some(scope) = self.scopes.last_mut() {
            scope.push(name.to_string());
            *self.in_scope.entry(name.to_string()).or_default() += 1;
        }
    }

    fn push_scope(&mut self, names: Vec<String>) {
        self.scopes.push(Vec::new());
        for name in names {
            self.declare(&name);
        }
    }

    fn pop_scope(&mut self) {
        for name in self.scopes.pop().unwrap_or_default() {
            if let Some(count) = self.in_scope.get_mut(&name) {
                *count = count.saturating_sub(1);
            }
        }
    }

    /// A pipeline up to the action's end (`until_close`) or up to `)`.
    fn pipeline(&mut self, line: usize, until_close: bool) -> Result<Pipe, ParseError> {
        let mut declare: Vec<Arc<str>> = Vec::new();
        let mut assign = false;
        // `$x :=`, `$x =`, `$i, $e :=`
        let lookahead: Vec<Tok> = self.tokens[self.at..]
            .iter()
            .take(4)
            .map(|t| t.tok.clone())
            .collect();
        match lookahead.as_slice() {
            [Tok::Variable(v, p), Tok::Declare, ..] if p.is_empty() => {
                declare.push(Arc::from(v.as_str()));
                self.at += 2;
            }
            [Tok::Variable(v, p), Tok::Assign, ..] if p.is_empty() => {
                if !self.declared(v) {
                    return Err(self.error(line, format!("undefined variable {v:?}")));
                }
                declare.push(Arc::from(v.as_str()));
                assign = true;
                self.at += 2;
            }
            [
                Tok::Variable(a, p),
                Tok::Comma,
                Tok::Variable(b, q),
                Tok::Declare,
            ] if p.is_empty() && q.is_empty() => {
                declare.push(Arc::from(a.as_str()));
                declare.push(Arc::from(b.as_str()));
                self.at += 4;
            }
            _ => {}
        }
        let mut commands = Vec::new();
        let mut args = Vec::new();
        loop {
            let Some(token) = self.next() else {
                return Err(self.error(line, "an action is never closed"));
            };
            match token.tok {
                Tok::Close if until_close => break,
                Tok::RightParen if !until_close => break,
                Tok::Pipe => {
                    if args.is_empty() {
                        return Err(self.error(token.line, "a pipeline has an empty command"));
                    }
                    commands.push(Command {
                        args: std::mem::take(&mut args),
                    });
                }
                tok => {
                    let operand = self.operand(tok, token.line)?;
                    args.push(operand);
                }
            }
        }
        if args.is_empty() {
            return Err(self.error(
                line,
                if commands.is_empty() {
                    "an empty action"
                } else {
                    "a pipeline ends with |"
                },
            ));
        }
        commands.push(Command { args });
        if !assign {
            for name in &declare {
                self.declare(name);
            }
        }
        Ok(Pipe {
            line,
            declare,
            assign,
            commands,
        })
    }

    fn operand(&mut self, tok: Tok, line: usize) -> Result<Operand, ParseError> {
        let operand = match tok {
            Tok::Ident(word) => match word.as_str() {
                "true" => Operand::Bool(true),
                "false" => Operand::Bool(false),
                "nil" => Operand::Nil,
                name => {
                    let (known, support) = self.function(name, line)?;
                    Operand::Function(known, support)
                }
            },
            Tok::Str(s) => Operand::Str(s.into()),
            Tok::Int(i) => Operand::Int(i),
            Tok::Float(f) => Operand::Float(f),
            Tok::Dot => Operand::Dot,
            Tok::Field(path) => Operand::Field(path),
            Tok::Variable(name, path) => {
                if !self.declared(&name) {
                    return Err(self.error(line, format!("undefined variable {name:?}")));
                }
                Operand::Variable(Arc::from(name.as_str()), path)
            }
            Tok::LeftParen => {
                self.enter(line)?;
                let pipe = self.pipeline(line, false)?;
                self.depth -= 1;
                let mut chain = Vec::new();
                while let Some(Token {
                    tok: Tok::Field(path),
                    spaced: false,
                    ..
                }) = self.peek()
                {
                    chain.extend(path.iter().cloned());
                    self.at += 1;
                }
                Operand::Nested(Box::new(pipe), chain)
            }
            other => return Err(self.error(line, format!("unexpected {other:?} in an operand"))),
        };
        Ok(operand)
    }

    fn function(&mut self, name: &str, line: usize) -> Result<(&'static str, Support), ParseError> {
        match functions::support(name) {
            Some((_, Support::No(reason))) => Err(self.error(
                line,
                format!("template function {name:?} is not supported: {reason}"),
            )),
            Some((known, support)) => {
                if !self.calls.contains(&known) {
                    self.calls.push(known);
                }
                Ok((known, support))
            }
            None => Err(self.error(line, format!("function {name:?} not defined"))),
        }
    }
}
