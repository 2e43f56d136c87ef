//! Every function a template can name: Go's own, consul-template's, and the `sprig_`
//! ones Nomad offers, each with whether berth has it. The parser refuses what is not
//! here ("not defined") and what berth lacks (with the reason); `docs/templates.md`
//! lists the same table, and a test keeps the two equal and renders every function
//! this says berth has.

/// Whether berth renders a function, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Go's `text/template` built-ins.
    Builtin,
    /// consul-template's (or sprig's), computed from its arguments alone.
    Yes,
    /// Answered by the renderer's [`crate::Data`]: the task's environment and files,
    /// Nomad's service catalog, the node's addresses.
    Data,
    /// Not in berth, with the reason the error gives.
    No(&'static str),
}

const VAULT: &str = "it reads Vault, which berth does not talk to";
const VARIABLES: &str = "it reads Nomad Variables, which berth does not store yet";
const CONSUL_CATALOG: &str =
    "it reads Consul's catalog of nodes and datacenters, which berth does not read";
const CONNECT_CA: &str =
    "it reads Consul Connect's certificate authority, which berth does not read";
const DENIED: &str = "Nomad denies it by default (function_denylist), and so does berth";
const NO_WRITER: &str = "berth has no writer for that format yet; toJSON is there";

/// Every function by name: what berth has, in the order of consul-template's docs.
pub const FUNCTIONS: &[(&str, Support)] = &[
    // Go's text/template
    ("and", Support::Builtin),
    ("or", Support::Builtin),
    ("not", Support::Builtin),
    ("len", Support::Builtin),
    ("index", Support::Builtin),
    ("slice", Support::Builtin),
    ("print", Support::Builtin),
    ("printf", Support::Builtin),
    ("println", Support::Builtin),
    ("eq", Support::Builtin),
    ("ne", Support::Builtin),
    ("lt", Support::Builtin),
    ("le", Support::Builtin),
    ("gt", Support::Builtin),
    ("ge", Support::Builtin),
    ("html", Support::Builtin),
    ("js", Support::Builtin),
    ("urlquery", Support::Builtin),
    (
        "call",
        Support::No("templates in berth are given no functions to call"),
    ),
    // consul-template: API functions
    ("caLeaf", Support::No(CONNECT_CA)),
    ("caRoots", Support::No(CONNECT_CA)),
    ("connect", Support::No(CONNECT_CA)),
    ("datacenters", Support::No(CONSUL_CATALOG)),
    ("file", Support::Data),
    ("key", Support::Data),
    ("keyExists", Support::Data),
    ("keyOrDefault", Support::Data),
    ("ls", Support::Data),
    ("safeLs", Support::Data),
    ("node", Support::No(CONSUL_CATALOG)),
    ("nodes", Support::No(CONSUL_CATALOG)),
    ("nomadService", Support::Data),
    ("nomadServices", Support::Data),
    ("nomadVar", Support::No(VARIABLES)),
    ("nomadVarExists", Support::No(VARIABLES)),
    ("nomadVarList", Support::No(VARIABLES)),
    ("nomadVarListSafe", Support::No(VARIABLES)),
    ("partitions", Support::No(CONSUL_CATALOG)),
    ("peerings", Support::No(CONSUL_CATALOG)),
    ("pkiCert", Support::No(VAULT)),
    ("secret", Support::No(VAULT)),
    ("secrets", Support::No(VAULT)),
    ("service", Support::Data),
    ("services", Support::Data),
    ("tree", Support::Data),
    ("safeTree", Support::Data),
    // consul-template: scratch
    (
        "scratch",
        Support::No("it needs method calls on a shared scratchpad; use variables"),
    ),
    // consul-template: helpers
    ("base64Decode", Support::Yes),
    ("base64Encode", Support::Yes),
    ("base64URLDecode", Support::Yes),
    ("base64URLEncode", Support::Yes),
    ("byKey", Support::Yes),
    (
        "byMeta",
        Support::No(
            "it groups Consul services by meta, which berth's service lookups do not carry yet",
        ),
    ),
    ("byTag", Support::Yes),
    ("contains", Support::Yes),
    ("containsAll", Support::Yes),
    ("containsAny", Support::Yes),
    ("containsNone", Support::Yes),
    ("containsNotAll", Support::Yes),
    ("env", Support::Data),
    ("envOrDefault", Support::Data),
    ("executeTemplate", Support::Builtin),
    ("explode", Support::Yes),
    ("explodeMap", Support::Yes),
    ("in", Support::Yes),
    ("indent", Support::Yes),
    ("join", Support::Yes),
    ("loop", Support::Yes),
    (
        "md5sum",
        Support::No("berth carries no MD5; sha256Hex is there"),
    ),
    ("mergeMap", Support::Yes),
    ("mergeMapWithOverride", Support::Yes),
    ("parseBool", Support::Yes),
    ("parseFloat", Support::Yes),
    ("parseInt", Support::Yes),
    ("parseJSON", Support::Yes),
    ("parseUint", Support::Yes),
    (
        "parseYAML",
        Support::No("berth carries no YAML reader; parseJSON is there"),
    ),
    ("plugin", Support::No(DENIED)),
    ("regexMatch", Support::Yes),
    ("regexReplaceAll", Support::Yes),
    ("replaceAll", Support::Yes),
    ("sha256Hex", Support::Yes),
    ("sockaddr", Support::Data),
    ("split", Support::Yes),
    ("splitToMap", Support::Yes),
    ("timestamp", Support::Yes),
    ("toJSON", Support::Yes),
    ("toJSONPretty", Support::Yes),
    ("toUnescapedJSON", Support::Yes),
    ("toUnescapedJSONPretty", Support::Yes),
    ("toLower", Support::Yes),
    ("toTitle", Support::Yes),
    ("toTOML", Support::No(NO_WRITER)),
    ("toUpper", Support::Yes),
    ("toYAML", Support::No(NO_WRITER)),
    ("trimSpace", Support::Yes),
    ("trim", Support::Yes),
    ("trimPrefix", Support::Yes),
    ("trimSuffix", Support::Yes),
    ("writeToFile", Support::No(DENIED)),
    // consul-template: math
    ("add", Support::Yes),
    ("subtract", Support::Yes),
    ("multiply", Support::Yes),
    ("divide", Support::Yes),
    ("modulo", Support::Yes),
    ("minimum", Support::Yes),
    ("maximum", Support::Yes),
    // consul-template: debugging
    (
        "spew_dump",
        Support::No("debugging output; use printf \"%v\""),
    ),
    ("spew_printf", Support::No("debugging output; use printf")),
    (
        "spew_sdump",
        Support::No("debugging output; use printf \"%v\""),
    ),
    ("spew_sprintf", Support::No("debugging output; use printf")),
    // sprig, as Nomad offers it (`sprig_` before each name)
    ("sprig_atoi", Support::Yes),
    ("sprig_b64dec", Support::Yes),
    ("sprig_b64enc", Support::Yes),
    ("sprig_coalesce", Support::Yes),
    ("sprig_contains", Support::Yes),
    ("sprig_default", Support::Yes),
    ("sprig_dict", Support::Yes),
    ("sprig_empty", Support::Yes),
    ("sprig_first", Support::Yes),
    ("sprig_has", Support::Yes),
    ("sprig_hasPrefix", Support::Yes),
    ("sprig_hasSuffix", Support::Yes),
    ("sprig_join", Support::Yes),
    ("sprig_last", Support::Yes),
    ("sprig_list", Support::Yes),
    ("sprig_lower", Support::Yes),
    ("sprig_quote", Support::Yes),
    ("sprig_repeat", Support::Yes),
    ("sprig_replace", Support::Yes),
    ("sprig_sha256sum", Support::Yes),
    ("sprig_sortAlpha", Support::Yes),
    ("sprig_split", Support::Yes),
    ("sprig_squote", Support::Yes),
    ("sprig_ternary", Support::Yes),
    ("sprig_toString", Support::Yes),
    ("sprig_trim", Support::Yes),
    ("sprig_trimAll", Support::Yes),
    ("sprig_uniq", Support::Yes),
    ("sprig_upper", Support::Yes),
];

const SPRIG_OTHERS: &str =
    "berth has the sprig functions listed in docs/templates.md, not this one";

/// The function `name` and whether berth has it; `None`: no such function anywhere.
pub fn support(name: &str) -> Option<(&'static str, Support)> {
    if let Some((known, support)) = FUNCTIONS.iter().find(|(n, _)| *n == name) {
        return Some((known, *support));
    }
    name.starts_with("sprig_")
        .then_some(("sprig_*", Support::No(SPRIG_OTHERS)))
}
