//! A small spanned YAML tree built from `saphyr-parser` events.
//!
//! Policy files need exact locations for every error and must not silently accept YAML
//! features that change meaning (anchors, merge keys, custom tags, duplicate keys), so the
//! tree is built here instead of through a generic DOM. Scalars keep their raw text: field
//! types are decided by the schema, as Go's yaml does for string fields.

use std::collections::HashSet;

use saphyr_parser::{Event, Parser, ScalarStyle, Span, Tag};

/// A 1-based position in the source text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pos {
    pub line: usize,
    pub column: usize,
}

impl Pos {
    fn of(span: &Span) -> Self {
        // saphyr's lines are 1-based but its columns count from 0.
        Pos {
            line: span.start.line(),
            column: span.start.col() + 1,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Scalar {
    pub text: String,
    pub style: ScalarStyle,
    pub pos: Pos,
}

impl Scalar {
    /// YAML 1.2 core-schema null: an empty or `~`/`null` plain scalar.
    pub fn is_null(&self) -> bool {
        self.style == ScalarStyle::Plain
            && matches!(self.text.as_str(), "" | "~" | "null" | "Null" | "NULL")
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Node {
    Scalar(Scalar),
    /// Entries in document order; keys are unique (duplicates are rejected while building).
    Mapping(Vec<(Scalar, Node)>, Pos),
    Sequence(Vec<Node>, Pos),
}

impl Node {
    pub fn pos(&self) -> Pos {
        match self {
            Node::Scalar(s) => s.pos,
            Node::Mapping(_, pos) | Node::Sequence(_, pos) => *pos,
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Node::Scalar(s) if s.is_null() => "null",
            Node::Scalar(_) => "a scalar",
            Node::Mapping(..) => "a mapping",
            Node::Sequence(..) => "a sequence",
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Node::Scalar(s) if s.is_null())
    }
}

/// A problem found while reading the YAML structure itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct YamlError {
    pub pos: Pos,
    pub field: String,
    pub message: String,
}

enum Frame {
    Mapping {
        entries: Vec<(Scalar, Node)>,
        pos: Pos,
        key: Option<Scalar>,
        seen: HashSet<String>,
        /// Set after a duplicate key: its value is parsed (to stay in sync) and dropped.
        skip_value: bool,
    },
    Sequence {
        items: Vec<Node>,
        pos: Pos,
    },
}

struct Builder {
    stack: Vec<Frame>,
    root: Option<Node>,
    documents: usize,
    max_depth: usize,
    errors: Vec<YamlError>,
}

/// Parses exactly one YAML document into a spanned tree. Structural problems that make the
/// rest of the document meaningless stop parsing; duplicate keys are all collected.
pub(crate) fn parse(text: &str, max_depth: usize) -> Result<Node, Vec<YamlError>> {
    let mut builder = Builder {
        stack: Vec::new(),
        root: None,
        documents: 0,
        max_depth,
        errors: Vec::new(),
    };
    for item in Parser::new_from_str(text) {
        let step = match item {
            Ok((event, span)) => builder.event(event, &span),
            Err(e) => Err(YamlError {
                pos: Pos {
                    line: e.marker().line(),
                    column: e.marker().col() + 1,
                },
                field: builder.path(),
                message: format!("invalid YAML: {}", e.info()),
            }),
        };
        if let Err(fatal) = step {
            builder.errors.push(fatal);
            return Err(builder.errors);
        }
    }
    if !builder.errors.is_empty() {
        return Err(builder.errors);
    }
    builder.root.ok_or_else(|| {
        vec![YamlError {
            pos: Pos { line: 1, column: 1 },
            field: "(document)".into(),
            message: "the file is empty: expected a mapping with `domain` and `descriptors`".into(),
        }]
    })
}

impl Builder {
    fn event(&mut self, event: Event<'_>, span: &Span) -> Result<(), YamlError> {
        let pos = Pos::of(span);
        match event {
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => Ok(()),
            Event::DocumentStart(_) => {
                self.documents += 1;
                if self.documents > 1 {
                    return Err(self.error(
                        pos,
                        "only one YAML document per file is supported (found `---`)",
                    ));
                }
                Ok(())
            }
            Event::Alias(_) => Err(self.error(pos, "YAML aliases (`*name`) are not supported")),
            Event::Scalar(text, style, anchor, tag) => {
                self.check_anchor(anchor, pos)?;
                self.check_tag(
                    tag.as_deref(),
                    &["str", "int", "bool", "float", "null"],
                    pos,
                )?;
                self.attach(Node::Scalar(Scalar {
                    text: text.into_owned(),
                    style,
                    pos,
                }))
            }
            Event::SequenceStart(anchor, tag) => {
                self.check_anchor(anchor, pos)?;
                self.check_tag(tag.as_deref(), &["seq"], pos)?;
                self.push(
                    Frame::Sequence {
                        items: Vec::new(),
                        pos,
                    },
                    pos,
                )
            }
            Event::MappingStart(anchor, tag) => {
                self.check_anchor(anchor, pos)?;
                self.check_tag(tag.as_deref(), &["map"], pos)?;
                self.push(
                    Frame::Mapping {
                        entries: Vec::new(),
                        pos,
                        key: None,
                        seen: HashSet::new(),
                        skip_value: false,
                    },
                    pos,
                )
            }
            Event::SequenceEnd | Event::MappingEnd => match self.stack.pop() {
                Some(Frame::Sequence { items, pos }) => self.attach(Node::Sequence(items, pos)),
                Some(Frame::Mapping { entries, pos, .. }) => {
                    self.attach(Node::Mapping(entries, pos))
                }
                None => Err(self.error(pos, "unbalanced YAML structure")),
            },
        }
    }

    fn push(&mut self, frame: Frame, pos: Pos) -> Result<(), YamlError> {
        // The parser itself is iterative; bounding nesting here bounds the recursion of
        // everything that later walks (and drops) the tree.
        if self.stack.len() >= self.max_depth {
            return Err(self.error(
                pos,
                format!("YAML nesting is deeper than {} levels", self.max_depth),
            ));
        }
        if let Some(Frame::Mapping { key: None, .. }) = self.stack.last() {
            return Err(self.error(
                pos,
                "mapping keys must be plain strings, not mappings or sequences",
            ));
        }
        self.stack.push(frame);
        Ok(())
    }

    fn attach(&mut self, node: Node) -> Result<(), YamlError> {
        let path = self.path();
        match self.stack.last_mut() {
            None => {
                self.root = Some(node);
                Ok(())
            }
            Some(Frame::Sequence { items, .. }) => {
                items.push(node);
                Ok(())
            }
            Some(Frame::Mapping {
                entries,
                key,
                seen,
                skip_value,
                ..
            }) => match key.take() {
                Some(k) => {
                    if !std::mem::take(skip_value) {
                        entries.push((k, node));
                    }
                    Ok(())
                }
                None => {
                    let Node::Scalar(k) = node else {
                        return Err(YamlError {
                            pos: node.pos(),
                            field: path,
                            message: "mapping keys must be plain strings".into(),
                        });
                    };
                    if !seen.insert(k.text.clone()) {
                        *skip_value = true;
                        let field = join_key(&path, &k.text);
                        self.errors.push(YamlError {
                            pos: k.pos,
                            field,
                            message: format!("duplicate key `{}` in this mapping", k.text),
                        });
                    }
                    *key = Some(k);
                    Ok(())
                }
            },
        }
    }

    fn check_anchor(&self, anchor: usize, pos: Pos) -> Result<(), YamlError> {
        if anchor != 0 {
            return Err(self.error(pos, "YAML anchors (`&name`) are not supported"));
        }
        Ok(())
    }

    fn check_tag(&self, tag: Option<&Tag>, allowed: &[&str], pos: Pos) -> Result<(), YamlError> {
        match tag {
            None => Ok(()),
            Some(t) if t.is_yaml_core_schema() && allowed.contains(&t.suffix.as_str()) => Ok(()),
            Some(t) => Err(self.error(
                pos,
                format!("YAML tag `{t}` is not supported here (only core tags such as `!!str`)"),
            )),
        }
    }

    fn error(&self, pos: Pos, message: impl Into<String>) -> YamlError {
        YamlError {
            pos,
            field: self.path(),
            message: message.into(),
        }
    }

    /// The field path of the node being built, e.g. `descriptors[1].rate_limit`.
    fn path(&self) -> String {
        let mut path = String::new();
        for frame in &self.stack {
            match frame {
                Frame::Mapping { key: Some(k), .. } => path = join_key(&path, &k.text),
                Frame::Mapping { key: None, .. } => {}
                Frame::Sequence { items, .. } => path.push_str(&format!("[{}]", items.len())),
            }
        }
        if path.is_empty() {
            path.push_str("(document)");
        }
        path
    }
}

fn join_key(path: &str, key: &str) -> String {
    if path.is_empty() || path == "(document)" {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar<'a>(node: &'a Node, key: &str) -> &'a Scalar {
        let Node::Mapping(entries, _) = node else {
            panic!("not a mapping")
        };
        match entries.iter().find(|(k, _)| k.text == key) {
            Some((_, Node::Scalar(s))) => s,
            other => panic!("no scalar {key}: {other:?}"),
        }
    }

    #[test]
    fn keeps_raw_text_and_positions() {
        let node = parse("domain: api\nvalue: 123\nflag: true\nq: \"x y\"\n", 16).unwrap();
        assert_eq!(scalar(&node, "value").text, "123");
        assert_eq!(scalar(&node, "flag").text, "true");
        assert_eq!(scalar(&node, "q").style, ScalarStyle::DoubleQuoted);
        assert_eq!(scalar(&node, "value").pos, Pos { line: 2, column: 8 });
        assert_eq!(scalar(&node, "domain").pos, Pos { line: 1, column: 9 });
    }

    #[test]
    fn rejects_duplicate_keys_at_the_second_one() {
        let errors = parse("a: 1\nb:\n  c: 1\n  c: 2\na: 3\n", 16).unwrap_err();
        assert_eq!(errors.len(), 2);
        assert_eq!((errors[0].pos.line, errors[0].pos.column), (4, 3));
        assert_eq!(errors[0].field, "b.c");
        assert_eq!(errors[1].pos.line, 5);
        assert_eq!(errors[1].field, "a");
    }

    #[test]
    fn rejects_anchors_aliases_tags_and_documents() {
        let e = parse("a: &x 1\nb: *x\n", 16).unwrap_err();
        assert!(e[0].message.contains("anchors"), "{e:?}");
        assert_eq!(e[0].pos.line, 1);
        let e = parse("a: !custom 1\n", 16).unwrap_err();
        assert!(e[0].message.contains("tag"), "{e:?}");
        assert!(parse("a: !!str 1\n", 16).is_ok());
        let e = parse("a: 1\n---\nb: 2\n", 16).unwrap_err();
        assert!(e[0].message.contains("one YAML document"), "{e:?}");
        assert_eq!(e[0].pos.line, 2);
        let e = parse("? [a]\n: 1\n", 16).unwrap_err();
        assert!(e[0].message.contains("keys"), "{e:?}");
        let e = parse("", 16).unwrap_err();
        assert!(e[0].message.contains("empty"), "{e:?}");
    }

    #[test]
    fn bounds_nesting_without_recursion() {
        let e = parse(&"[".repeat(40), 16).unwrap_err();
        assert!(e[0].message.contains("nesting"), "{e:?}");
        // The parser has its own recursion limit; either way it is an error, not a crash.
        assert!(parse(&"[".repeat(100_000), 16).is_err());
    }

    #[test]
    fn syntax_errors_are_located() {
        let e = parse("a: 1\nb: [1, 2\n", 16).unwrap_err();
        assert!(e[0].message.starts_with("invalid YAML"), "{e:?}");
        assert!(e[0].pos.line >= 2, "{e:?}");
    }
}
