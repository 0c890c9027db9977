//! Enums spelled by name ([`crate::named_enum!`]): in flags, option files, JSON and messages, a
//! variant is its name, declared once beside it.

/// `names` for a message: `a, b or c`.
pub fn one_of(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [one] => (*one).to_string(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// Declares an enum whose variants are spelled by name, each name written once beside its
/// variant (`Variant = "name"`, with other spellings it also takes after `|`). The enum gets
/// `NAMES`, `name()`, `parse()` (an unknown name is an error that lists the known ones, as
/// `unknown WHAT "x": use a, b or c`), `FromStr`, `Display`, and serde's `Serialize` and
/// `Deserialize` by name (the calling crate depends on serde). Variants carry no data.
#[macro_export]
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident ($what:literal) {
            $(
                $(#[$vmeta:meta])*
                $variant:ident = $text:literal $(| $alias:literal)*
            ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every variant's name, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$($text),+];

            /// This variant's name.
            pub fn name(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }

            /// The variant named `s`.
            pub fn parse(s: &str) -> ::std::result::Result<Self, String> {
                match s {
                    $( $text $(| $alias)* => Ok($name::$variant), )+
                    _ => Err(format!(
                        "unknown {} {:?}: use {}",
                        $what,
                        s,
                        $crate::names::one_of(Self::NAMES)
                    )),
                }
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> ::std::result::Result<Self, String> {
                Self::parse(s)
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(
                &self,
                s: S,
            ) -> ::std::result::Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(
                d: D,
            ) -> ::std::result::Result<Self, D::Error> {
                let s = <String as ::serde::Deserialize>::deserialize(d)?;
                Self::parse(&s).map_err(::serde::de::Error::custom)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::one_of;

    #[test]
    fn names_read_as_a_list() {
        assert_eq!(one_of(&["a"]), "a");
        assert_eq!(one_of(&["a", "b"]), "a or b");
        assert_eq!(one_of(&["a", "b", "c"]), "a, b or c");
    }
}
