//! What a driver's config type looks like, read from the type itself: the fields of the
//! task's `config` block, each with its type as an HCL type constraint and whether a
//! task must set it, for `berth driver inspect`.
//!
//! The type is asked to deserialize from readers that answer every request with a
//! placeholder (`""`, `0`, `false`, one element) and write down what was requested: a
//! `String` asks for a string, a `Vec<u32>` for a sequence of numbers, a struct for its
//! fields. A field is required when serde itself says it is missing from a block that
//! has only the fields found required so far. Where a placeholder is refused (a type with
//! its own parsing), the rest are judged by type: an `Option` is not required.

use serde::de::{
    self, DeserializeOwned, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, MapAccess,
    SeqAccess, VariantAccess, Visitor,
};

type Error = de::value::Error;

/// How deep a type is followed: a recursive type (a struct holding a `Vec` of itself)
/// would be followed forever.
const MAX_DEPTH: usize = 12;

/// A field of a config type, as read from the type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    /// An HCL type constraint: `string`, `list(string)`, `object({ path = string })`.
    pub hcl_type: String,
    pub required: bool,
}

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
    Object(Vec<(&'static str, Shape)>),
    Enum(&'static [&'static str]),
}

impl Shape {
    fn hcl(&self) -> String {
        match self {
            Shape::Any | Shape::Null => "any".into(),
            Shape::Bool => "bool".into(),
            Shape::Number => "number".into(),
            Shape::String => "string".into(),
            Shape::Optional(inner) => inner.hcl(),
            Shape::List(element) => format!("list({})", element.hcl()),
            Shape::Tuple(elements) => {
                let elements: Vec<String> = elements.iter().map(Shape::hcl).collect();
                format!("tuple([{}])", elements.join(", "))
            }
            Shape::Map(value) => format!("map({})", value.hcl()),
            Shape::Object(fields) => {
                let fields: Vec<String> = (fields.iter())
                    .map(|(name, shape)| match shape {
                        Shape::Optional(inner) => format!("{name} = optional({})", inner.hcl()),
                        shape => format!("{name} = {}", shape.hcl()),
                    })
                    .collect();
                format!("object({{ {} }})", fields.join(", "))
            }
            Shape::Enum(variants) => {
                let variants: Vec<String> = variants.iter().map(|v| format!("{v:?}")).collect();
                format!("string ({})", variants.join(" or "))
            }
        }
    }
}

/// The fields of `C`, in declaration order; `None` when `C` is no struct (a driver that
/// reads its config as `serde_json::Value`, or a struct with a flattened part).
pub fn fields<C: DeserializeOwned>() -> Option<Vec<Field>> {
    let names = struct_fields::<C>()?;
    let shapes: Vec<Shape> = (0..names.len())
        .map(|index| {
            let mut shapes = vec![Shape::Any; names.len()];
            let _ = C::deserialize(Block {
                names,
                present: &[index],
                shapes: &mut shapes,
            });
            shapes.swap_remove(index)
        })
        .collect();
    let required = required_fields::<C>(names, &shapes);
    Some(
        (names.iter().zip(shapes).zip(required))
            .map(|((name, shape), required)| Field {
                name: (*name).to_string(),
                hcl_type: shape.hcl(),
                required,
            })
            .collect(),
    )
}

/// Which of `names` serde calls missing: one per try, each try with the ones found so far.
fn required_fields<C: DeserializeOwned>(
    names: &'static [&'static str],
    shapes: &[Shape],
) -> Vec<bool> {
    let mut required = vec![false; names.len()];
    let mut present = Vec::new();
    for _ in 0..=names.len() {
        let mut scratch = vec![Shape::Any; names.len()];
        let outcome = C::deserialize(Block {
            names,
            present: &present,
            shapes: &mut scratch,
        });
        let Err(error) = outcome else {
            return required;
        };
        let message = error.to_string();
        let missing = (message.strip_prefix("missing field `"))
            .and_then(|rest| rest.strip_suffix('`'))
            .and_then(|name| names.iter().position(|n| *n == name))
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
            required[index] = !matches!(shape, Shape::Optional(_) | Shape::Any);
        }
    }
    required
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
}

impl<'de> Deserializer<'de> for Block<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        let present = self.present.to_vec();
        visitor.visit_map(Fields {
            names: self.names,
            order: present.into_iter(),
            shapes: self.shapes,
            depth: 0,
            next: None,
        })
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

/// A struct's fields, in `order`, each a placeholder whose shape goes to `shapes`.
struct Fields<'a, I> {
    names: &'static [&'static str],
    order: I,
    shapes: &'a mut [Shape],
    depth: usize,
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
        match self.shapes.get_mut(index) {
            Some(shape) => seed.deserialize(Probe {
                shape,
                depth: self.depth + 1,
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
    depth: usize,
}

impl Probe<'_> {
    fn too_deep(&mut self) -> Option<Error> {
        (self.depth > MAX_DEPTH).then(|| de::Error::custom("nested too deep"))
    }
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

    fn deserialize_option<V: Visitor<'de>>(mut self, visitor: V) -> Result<V::Value, Error> {
        if let Some(error) = self.too_deep() {
            return Err(error);
        }
        let mut inner = Shape::Any;
        let outcome = visitor.visit_some(Probe {
            shape: &mut inner,
            depth: self.depth + 1,
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
        mut self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        // Counted as a level: `struct R(Box<R>)` would otherwise never end.
        if let Some(error) = self.too_deep() {
            return Err(error);
        }
        visitor.visit_newtype_struct(Probe {
            shape: self.shape,
            depth: self.depth + 1,
        })
    }

    fn deserialize_seq<V: Visitor<'de>>(mut self, visitor: V) -> Result<V::Value, Error> {
        if let Some(error) = self.too_deep() {
            return Err(error);
        }
        let mut elements = vec![Shape::Any];
        let outcome = visitor.visit_seq(Elements {
            shapes: &mut elements,
            given: 0,
            depth: self.depth,
        });
        *self.shape = Shape::List(Box::new(elements.swap_remove(0)));
        outcome
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        mut self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        if let Some(error) = self.too_deep() {
            return Err(error);
        }
        let mut elements = vec![Shape::Any; len.min(16)];
        let outcome = visitor.visit_seq(Elements {
            shapes: &mut elements,
            given: 0,
            depth: self.depth,
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

    fn deserialize_map<V: Visitor<'de>>(mut self, visitor: V) -> Result<V::Value, Error> {
        if let Some(error) = self.too_deep() {
            return Err(error);
        }
        let mut value = Shape::Any;
        let outcome = visitor.visit_map(OneEntry {
            value: &mut value,
            given: false,
            depth: self.depth,
        });
        *self.shape = Shape::Map(Box::new(value));
        outcome
    }

    fn deserialize_struct<V: Visitor<'de>>(
        mut self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        if let Some(error) = self.too_deep() {
            return Err(error);
        }
        let mut shapes = vec![Shape::Any; fields.len()];
        let outcome = visitor.visit_map(Fields {
            names: fields,
            order: 0..fields.len(),
            shapes: &mut shapes,
            depth: self.depth,
            next: None,
        });
        *self.shape = Shape::Object(fields.iter().copied().zip(shapes).collect());
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
    depth: usize,
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
            depth: self.depth + 1,
        })
        .map(Some)
    }
}

/// A map of one placeholder entry, whose value's shape is written down.
struct OneEntry<'a> {
    value: &'a mut Shape,
    given: bool,
    depth: usize,
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
            depth: self.depth + 1,
        })
        .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        seed.deserialize(Probe {
            shape: self.value,
            depth: self.depth + 1,
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
                "mounts list(object({ source = string, read_only = bool })) (required)",
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

    #[test]
    fn a_recursive_type_is_followed_only_so_deep() {
        #[derive(serde::Deserialize)]
        #[allow(dead_code, reason = "read by serde only")]
        struct Node {
            name: String,
            children: Vec<Node>,
        }
        let fields = fields::<Node>().expect("a struct");
        assert_eq!(fields[0].hcl_type, "string");
        assert!(
            fields[1]
                .hcl_type
                .starts_with("list(object({ name = string, children = list(")
        );
        assert!(fields[1].hcl_type.contains("any"), "{}", fields[1].hcl_type);
        assert!(
            fields[1].hcl_type.len() < 2048,
            "{}",
            fields[1].hcl_type.len()
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
