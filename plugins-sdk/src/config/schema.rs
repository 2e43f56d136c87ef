//! What a driver's config type looks like, read from the type itself: the fields of the
//! task's `config` block, each with its type as an HCL type constraint and whether a
//! task must set it, for `berth driver inspect`.
//!
//! The type is asked to deserialize from readers that answer every request with a
//! placeholder (`""`, `0`, `false`, one element) and write down what was requested: a
//! `String` asks for a string, a `Vec<u32>` for a sequence of numbers, a struct for its
//! fields. A field is required when serde itself says it is missing from a block that
//! has only the fields found required so far; a nested block's fields are found the
//! same way, each block in turn. Where a placeholder is refused (a type with its own
//! parsing), the fields not yet tried are judged by type: an `Option` is not required.

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, MapAccess,
    SeqAccess, VariantAccess, Visitor,
};

type Error = de::value::Error;

/// How deep a type is followed. Past it, an `Option` is `None` and a list or map is
/// empty, which ends a recursive type (a struct holding a `Vec` of itself).
const MAX_DEPTH: usize = 12;

/// A field of a config type, as read from the type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    /// An HCL type constraint: `string`, `list(string)`, `object({ path = string })`.
    pub hcl_type: String,
    pub required: bool,
}

/// Where a struct is in the config type: the field names leading to it, and its name.
type Key = (Vec<&'static str>, &'static str);

/// The fields one run gives the struct at a key (by index); every other struct gets all
/// of its fields.
type Plan = Option<(Key, Vec<usize>)>;

/// The shape a type asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Shape {
    /// Nothing was asked (the type failed first) or anything goes (`serde_json::Value`).
    Any,
    Bool,
    Number,
    String,
    Null,
    Optional(Box<Shape>),
    List(Box<Shape>),
    Tuple(Vec<Shape>),
    Map(Box<Shape>),
    Object {
        key: Key,
        fields: Vec<ObjectField>,
    },
    Enum(&'static [&'static str]),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct ObjectField {
    name: &'static str,
    shape: Shape,
    required: bool,
}

impl Shape {
    fn hcl(&self) -> String {
        self.hcl_within(&mut Vec::new())
    }

    /// `inside`: the structs this one is nested in; one met again is `any`, so a
    /// recursive type is written out once.
    fn hcl_within(&self, inside: &mut Vec<&'static str>) -> String {
        match self {
            Shape::Any | Shape::Null => "any".into(),
            Shape::Bool => "bool".into(),
            Shape::Number => "number".into(),
            Shape::String => "string".into(),
            Shape::Optional(inner) => inner.hcl_within(inside),
            Shape::List(element) => format!("list({})", element.hcl_within(inside)),
            Shape::Tuple(elements) => {
                let elements: Vec<String> = (elements.iter())
                    .map(|element| element.hcl_within(inside))
                    .collect();
                format!("tuple([{}])", elements.join(", "))
            }
            Shape::Map(value) => format!("map({})", value.hcl_within(inside)),
            Shape::Object { key, .. } if inside.contains(&key.1) => "any".into(),
            Shape::Object { key, fields } => {
                inside.push(key.1);
                let fields: Vec<String> = (fields.iter())
                    .map(|field| {
                        let shape = field.shape.hcl_within(inside);
                        if field.required {
                            format!("{} = {shape}", field.name)
                        } else {
                            format!("{} = optional({shape})", field.name)
                        }
                    })
                    .collect();
                inside.pop();
                format!("object({{ {} }})", fields.join(", "))
            }
            Shape::Enum(variants) => {
                let variants: Vec<String> = variants.iter().map(|v| format!("{v:?}")).collect();
                format!("string ({})", variants.join(" or "))
            }
        }
    }

    /// Whether a field of this shape may be left out, as far as its type tells.
    fn optional_by_type(&self) -> bool {
        matches!(self, Shape::Optional(_) | Shape::Any)
    }
}

/// The fields of `C`, in declaration order; `None` when `C` is no struct (a driver that
/// reads its config as `serde_json::Value`, or a struct with a flattened part).
pub fn fields<C: DeserializeOwned>() -> Option<Vec<Field>> {
    let names = struct_fields::<C>()?;
    // Each field in a run of its own, so one whose placeholder is refused hides no other.
    let mut shapes: Vec<Shape> = (0..names.len())
        .map(|index| run::<C>(names, &[index], &None).1.swap_remove(index))
        .collect();
    // serde lists a field's aliases among its fields (before or after it): given both,
    // serde says "duplicate field" and names the field, so the other is the alias.
    let mut alias = vec![false; names.len()];
    for later in 0..names.len() {
        for earlier in (0..later).filter(|&earlier| shapes[earlier] == shapes[later]) {
            let Err(error) = run::<C>(names, &[earlier, later], &None).0 else {
                continue;
            };
            let message = error.to_string();
            if message == format!("duplicate field `{}`", names[earlier]) {
                alias[later] = true;
            } else if message == format!("duplicate field `{}`", names[later]) {
                alias[earlier] = true;
            }
        }
    }
    let present: Vec<usize> = (0..names.len()).collect();
    let required = required_fields(
        names.len(),
        &shapes,
        |given| run::<C>(names, given, &None).0,
        |name| names.iter().position(|n| *n == name),
    );
    for shape in &mut shapes {
        required_in_objects::<C>(names, &present, shape);
    }
    Some(
        (names.iter().zip(shapes).zip(required).zip(alias))
            .filter(|(_, alias)| !alias)
            .map(|(((name, shape), required), _)| Field {
                name: (*name).to_string(),
                hcl_type: shape.hcl(),
                required,
            })
            .collect(),
    )
}

/// One deserialization of `C` from a block with the top-level fields at `present`,
/// following `plan`: what serde said, and the shapes it asked for.
fn run<C: DeserializeOwned>(
    names: &'static [&'static str],
    present: &[usize],
    plan: &Plan,
) -> (Result<C, Error>, Vec<Shape>) {
    let mut shapes = vec![Shape::Any; names.len()];
    let outcome = C::deserialize(Block {
        names,
        present,
        shapes: &mut shapes,
        plan,
    });
    (outcome, shapes)
}

/// Which of `count` fields serde calls missing: one per try, each try (`attempt`) with
/// the fields found so far. `index_of` finds a field by the name serde gives.
fn required_fields<T>(
    count: usize,
    shapes: &[Shape],
    mut attempt: impl FnMut(&[usize]) -> Result<T, Error>,
    index_of: impl Fn(&str) -> Option<usize>,
) -> Vec<bool> {
    let mut required = vec![false; count];
    let mut present = Vec::new();
    for _ in 0..=count {
        let Err(error) = attempt(&present) else {
            return required;
        };
        let message = error.to_string();
        let missing = (message.strip_prefix("missing field `"))
            .and_then(|rest| rest.strip_suffix('`'))
            .and_then(&index_of)
            .filter(|index| !present.contains(index));
        match missing {
            Some(index) => {
                required[index] = true;
                present.push(index);
            }
            None => break,
        }
    }
    // A placeholder was refused: the fields not yet tried are judged by their type.
    for (index, shape) in shapes.iter().enumerate() {
        if !present.contains(&index) {
            required[index] = !shape.optional_by_type();
        }
    }
    required
}

/// Which fields of every struct nested in `shape` are required, a struct at a time: the
/// whole block is given, and that struct only the fields found required so far.
fn required_in_objects<C: DeserializeOwned>(
    names: &'static [&'static str],
    present: &[usize],
    shape: &mut Shape,
) {
    match shape {
        Shape::Object { key, fields } => {
            let shapes: Vec<Shape> = fields.iter().map(|f| f.shape.clone()).collect();
            let required = required_fields(
                fields.len(),
                &shapes,
                |given| {
                    let plan = Some((key.clone(), given.to_vec()));
                    run::<C>(names, present, &plan).0
                },
                |name| fields.iter().position(|f| f.name == name),
            );
            for (field, required) in fields.iter_mut().zip(required) {
                field.required = required;
                required_in_objects::<C>(names, present, &mut field.shape);
            }
        }
        Shape::Optional(inner) | Shape::List(inner) | Shape::Map(inner) => {
            required_in_objects::<C>(names, present, inner);
        }
        Shape::Tuple(elements) => {
            for element in elements {
                required_in_objects::<C>(names, present, element);
            }
        }
        _ => {}
    }
}

/// The field names of `C` when it deserializes as a struct.
pub(super) fn struct_fields<C: DeserializeOwned>() -> Option<&'static [&'static str]> {
    let mut names = None;
    let _ = C::deserialize(FieldNames(&mut names));
    names
}

struct FieldNames<'a>(&'a mut Option<&'static [&'static str]>);

impl<'de> Deserializer<'de> for FieldNames<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Error> {
        *self.0 = Some(fields);
        Err(de::Error::custom("field names recorded"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// The task's `config` block, with only the fields at `present`, each a placeholder.
struct Block<'a> {
    names: &'static [&'static str],
    present: &'a [usize],
    shapes: &'a mut [Shape],
    plan: &'a Plan,
}

impl<'de> Deserializer<'de> for Block<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let present = self.present.to_vec();
        visitor.visit_map(Fields {
            names: self.names,
            order: present.into_iter(),
            shapes: self.shapes,
            at: Place {
                depth: 0,
                path: Vec::new(),
                plan: self.plan,
            },
            next: None,
        })
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

/// Where a placeholder is: how deep, under which field names, in which run.
#[derive(Clone)]
struct Place<'a> {
    depth: usize,
    path: Vec<&'static str>,
    plan: &'a Plan,
}

impl<'a> Place<'a> {
    /// One level down, under `field` when it is a struct's field.
    fn below(&self, field: Option<&'static str>) -> Place<'a> {
        let mut path = self.path.clone();
        path.extend(field);
        Place {
            depth: self.depth + 1,
            path,
            plan: self.plan,
        }
    }

    fn too_deep(&self) -> bool {
        self.depth > MAX_DEPTH
    }

    /// Whether what this holds (an `Option`'s value, a list's elements) would be too deep:
    /// then it holds nothing, which ends a recursive type without an error.
    fn holds_too_deep(&self) -> bool {
        self.depth >= MAX_DEPTH
    }
}

/// A struct's fields, in `order`, each a placeholder whose shape goes to `shapes`.
struct Fields<'a, I> {
    names: &'static [&'static str],
    order: I,
    shapes: &'a mut [Shape],
    /// The struct's own place.
    at: Place<'a>,
    next: Option<usize>,
}

impl<'de, I: Iterator<Item = usize>> MapAccess<'de> for Fields<'_, I> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some(index) = self.order.next() else {
            return Ok(None);
        };
        self.next = Some(index);
        let name = self.names.get(index).copied().unwrap_or_default();
        seed.deserialize(name.into_deserializer()).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let index = self.next.take().unwrap_or_default();
        let name = self.names.get(index).copied();
        match self.shapes.get_mut(index) {
            Some(shape) => seed.deserialize(Probe {
                shape,
                at: self.at.below(name),
            }),
            None => Err(de::Error::custom("no such field")),
        }
    }
}

/// Forwards each `deserialize_*` method to the one that reads the same shape.
macro_rules! forward {
    ($($($method:ident)+ => $to:ident;)+) => {
        $($(
            fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
                self.$to(visitor)
            }
        )+)+
    };
}

/// A placeholder value that writes down what was asked of it.
struct Probe<'a> {
    shape: &'a mut Shape,
    at: Place<'a>,
}

fn too_deep() -> Error {
    de::Error::custom("nested too deep")
}

impl<'de> Deserializer<'de> for Probe<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        *self.shape = Shape::Any;
        visitor.visit_unit()
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        *self.shape = Shape::Bool;
        visitor.visit_bool(false)
    }

    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        *self.shape = Shape::Number;
        visitor.visit_i64(0)
    }

    fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        *self.shape = Shape::Number;
        visitor.visit_u64(0)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        *self.shape = Shape::Number;
        visitor.visit_f64(0.0)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        *self.shape = Shape::String;
        visitor.visit_str("")
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        *self.shape = Shape::List(Box::new(Shape::Number));
        visitor.visit_bytes(&[])
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        if self.at.holds_too_deep() {
            *self.shape = Shape::Optional(Box::new(Shape::Any));
            return visitor.visit_none();
        }
        let mut inner = Shape::Any;
        let outcome = visitor.visit_some(Probe {
            shape: &mut inner,
            at: self.at.below(None),
        });
        *self.shape = Shape::Optional(Box::new(inner));
        outcome
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        *self.shape = Shape::Null;
        visitor.visit_unit()
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        // Counted as a level: `struct R(Box<R>)` would otherwise never end.
        if self.at.too_deep() {
            return Err(too_deep());
        }
        let at = self.at.below(None);
        visitor.visit_newtype_struct(Probe {
            shape: self.shape,
            at,
        })
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let given = if self.at.holds_too_deep() { 0 } else { 1 };
        let mut elements = vec![Shape::Any; given];
        let outcome = visitor.visit_seq(Elements {
            shapes: &mut elements,
            given: 0,
            at: self.at.below(None),
        });
        *self.shape = Shape::List(Box::new(elements.pop().unwrap_or(Shape::Any)));
        outcome
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Error> {
        if self.at.too_deep() {
            return Err(too_deep());
        }
        let mut elements = vec![Shape::Any; len.min(16)];
        let outcome = visitor.visit_seq(Elements {
            shapes: &mut elements,
            given: 0,
            at: self.at.below(None),
        });
        *self.shape = Shape::Tuple(elements);
        outcome
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_tuple(len, visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let mut value = Shape::Any;
        let outcome = visitor.visit_map(OneEntry {
            value: &mut value,
            given: self.at.holds_too_deep(),
            at: self.at.below(None),
        });
        *self.shape = Shape::Map(Box::new(value));
        outcome
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        if self.at.too_deep() {
            return Err(too_deep());
        }
        let key: Key = (self.at.path.clone(), name);
        let order: Vec<usize> = match self.at.plan {
            Some((planned, given)) if *planned == key => given.clone(),
            _ => (0..fields.len()).collect(),
        };
        let mut shapes = vec![Shape::Any; fields.len()];
        let outcome = visitor.visit_map(Fields {
            names: fields,
            order: order.into_iter(),
            shapes: &mut shapes,
            at: self.at.clone(),
            next: None,
        });
        let fields = (fields.iter().zip(shapes))
            .map(|(name, shape)| ObjectField {
                name,
                required: !shape.optional_by_type(),
                shape,
            })
            .collect();
        *self.shape = Shape::Object { key, fields };
        outcome
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        *self.shape = Shape::Enum(variants);
        visitor.visit_enum(FirstVariant(variants.first().copied().unwrap_or_default()))
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    forward! {
        deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i128 => deserialize_i64;
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u128 => deserialize_u64;
        deserialize_f32 => deserialize_f64;
        deserialize_char deserialize_string deserialize_identifier => deserialize_str;
        deserialize_byte_buf => deserialize_bytes;
    }
}

/// A sequence of `shapes.len()` placeholders.
struct Elements<'a> {
    shapes: &'a mut [Shape],
    given: usize,
    at: Place<'a>,
}

impl<'de> SeqAccess<'de> for Elements<'_> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        let Some(shape) = self.shapes.get_mut(self.given) else {
            return Ok(None);
        };
        self.given += 1;
        seed.deserialize(Probe {
            shape,
            at: self.at.clone(),
        })
        .map(Some)
    }
}

/// A map of one placeholder entry (none once `given`), whose value's shape is written down.
struct OneEntry<'a> {
    value: &'a mut Shape,
    given: bool,
    at: Place<'a>,
}

impl<'de> MapAccess<'de> for OneEntry<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        if std::mem::replace(&mut self.given, true) {
            return Ok(None);
        }
        // Keys are strings in a jobspec, whatever type the map reads them as.
        let mut key = Shape::Any;
        seed.deserialize(Probe {
            shape: &mut key,
            at: self.at.clone(),
        })
        .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        seed.deserialize(Probe {
            shape: self.value,
            at: self.at.clone(),
        })
    }
}

/// An enum's first variant, as a unit: enough to have been asked for it.
struct FirstVariant(&'static str);

impl<'de> EnumAccess<'de> for FirstVariant {
    type Error = Error;
    type Variant = Self;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Self), Error> {
        let value = seed.deserialize(self.0.into_deserializer())?;
        Ok((value, self))
    }
}

impl<'de> VariantAccess<'de> for FirstVariant {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, _seed: T) -> Result<T::Value, Error> {
        Err(de::Error::custom("a variant with data"))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, _visitor: V) -> Result<V::Value, Error> {
        Err(de::Error::custom("a variant with data"))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Error> {
        Err(de::Error::custom("a variant with data"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[derive(serde::Deserialize)]
    #[allow(dead_code, reason = "read by serde only")]
    struct Mount {
        source: String,
        #[serde(default)]
        read_only: bool,
    }

    #[derive(serde::Deserialize)]
    #[serde(rename_all = "lowercase")]
    #[allow(dead_code, reason = "read by serde only")]
    enum Pull {
        Always,
        Missing,
    }

    #[derive(serde::Deserialize)]
    #[allow(dead_code, reason = "read by serde only")]
    struct Config {
        command: String,
        #[serde(default)]
        args: Vec<String>,
        timeout: Option<u32>,
        env: BTreeMap<String, String>,
        mounts: Vec<Mount>,
        pull: Pull,
        #[serde(default = "yes")]
        interactive: bool,
    }

    fn yes() -> bool {
        true
    }

    fn shown(fields: &[Field]) -> Vec<String> {
        (fields.iter())
            .map(|f| {
                format!(
                    "{} {}{}",
                    f.name,
                    f.hcl_type,
                    if f.required { " (required)" } else { "" }
                )
            })
            .collect()
    }

    #[test]
    fn a_structs_fields_are_read_with_their_types_and_whether_they_are_required() {
        let fields = fields::<Config>().expect("a struct");
        assert_eq!(
            shown(&fields),
            [
                "command string (required)",
                "args list(string)",
                "timeout number",
                "env map(string) (required)",
                "mounts list(object({ source = string, read_only = optional(bool) })) (required)",
                "pull string (\"always\" or \"missing\") (required)",
                "interactive bool",
            ]
        );
    }

    #[test]
    fn loose_config_has_no_fields_and_no_config_has_none_at_all() {
        assert_eq!(fields::<serde_json::Value>(), None);
        assert_eq!(fields::<super::super::NoConfig>(), Some(vec![]));
    }

    /// A recursive type ends where an `Option` is `None` and a list empty, so the fields
    /// after its recursive one are still read, and it is written out once.
    #[test]
    fn a_recursive_type_is_written_out_once_and_hides_no_field_after_it() {
        #[derive(serde::Deserialize)]
        #[allow(dead_code, reason = "read by serde only")]
        struct Node {
            name: String,
            children: Vec<Node>,
            parent: Option<Box<Node>>,
            weight: u32,
        }
        #[derive(serde::Deserialize)]
        #[allow(dead_code, reason = "read by serde only")]
        struct Config {
            tree: Node,
            label: String,
        }
        let fields = fields::<Config>().expect("a struct");
        assert_eq!(
            shown(&fields),
            [
                "tree object({ name = string, children = list(any), parent = optional(any), \
                 weight = number }) (required)",
                "label string (required)",
            ]
        );
    }

    /// A nested block's own fields are required or not as serde says of that block.
    #[test]
    fn a_nested_blocks_defaults_are_optional_and_its_other_fields_required() {
        #[derive(serde::Deserialize)]
        #[allow(dead_code, reason = "read by serde only")]
        struct Port {
            #[serde(default)]
            host: u16,
            container: u16,
            #[serde(default = "tcp")]
            protocol: String,
        }
        fn tcp() -> String {
            "tcp".into()
        }
        #[derive(serde::Deserialize)]
        #[allow(dead_code, reason = "read by serde only")]
        struct Config {
            #[serde(default)]
            ports: BTreeMap<String, Port>,
            image: String,
        }
        let fields = fields::<Config>().expect("a struct");
        assert_eq!(
            shown(&fields),
            [
                "ports map(object({ host = optional(number), container = number, protocol = \
                 optional(string) }))",
                "image string (required)",
            ]
        );
    }

    /// serde lists an alias among the fields; it is another name of one, not a field.
    #[test]
    fn an_alias_is_not_listed_as_a_field_of_its_own() {
        #[derive(serde::Deserialize)]
        #[allow(dead_code, reason = "read by serde only")]
        struct Config {
            #[serde(alias = "cmd")]
            command: String,
            #[serde(default)]
            args: Vec<String>,
            label: String,
        }
        assert_eq!(
            shown(&fields::<Config>().expect("a struct")),
            [
                "command string (required)",
                "args list(string)",
                "label string (required)"
            ]
        );
    }

    #[test]
    fn a_recursive_newtype_ends() {
        #[derive(serde::Deserialize)]
        #[allow(dead_code, reason = "read by serde only")]
        struct Wrapped(Box<Wrapped>);
        #[derive(serde::Deserialize)]
        #[allow(dead_code, reason = "read by serde only")]
        struct Config {
            wrapped: Wrapped,
            label: String,
        }
        let fields = fields::<Config>().expect("a struct");
        assert_eq!(fields[0].hcl_type, "any");
        assert_eq!(fields[1].hcl_type, "string");
    }

    #[test]
    fn a_field_that_refuses_placeholders_is_judged_by_its_type() {
        #[derive(Debug)]
        struct Duration;
        impl<'de> serde::Deserialize<'de> for Duration {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                Err(de::Error::custom(format!("not a duration: {text:?}")))
            }
        }
        #[derive(serde::Deserialize)]
        #[allow(dead_code, reason = "read by serde only")]
        struct Config {
            every: Duration,
            label: String,
            note: Option<String>,
        }
        let fields = fields::<Config>().expect("a struct");
        assert_eq!(
            shown(&fields),
            [
                "every string (required)",
                "label string (required)",
                "note string"
            ]
        );
    }
}
