//! The descriptor tree, compiled for lookups that neither allocate nor lock.
//!
//! Per level and key, a request entry's value is tried against, in order:
//! 1. the exact `value` (hash lookup);
//! 2. wildcard values (containing `*`, which matches any run of bytes, including
//!    none). When several match, the one with the longest literal text before its first `*`
//!    wins; ties go to the one declared first;
//! 3. the key-only descriptor (no `value`), which matches any value.
//!
//! One node is chosen per level and there is no backtracking: if the chosen node has no
//! child for the next entry, the request matches nothing (as in the reference).
//!
//! Request keys and values are bytes, compared byte for byte: Envoy may put any header byte
//! in a value, and a value that is not UTF-8 must be matched like any other, never refused
//! (a refused call is one Envoy lets through by default). Policy text is UTF-8, so on UTF-8
//! values this is exactly string matching.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

/// Index into the matcher's node arena.
pub(crate) type NodeId = usize;

#[derive(Debug, Default)]
pub(crate) struct Level {
    keys: HashMap<Box<[u8]>, KeyEntry>,
}

#[derive(Debug, Default)]
struct KeyEntry {
    exact: HashMap<Box<[u8]>, NodeId>,
    wildcards: Wildcards,
    any: Option<NodeId>,
}

/// A key's wildcard values, indexed so that a lookup costs a few hash probes instead of a
/// scan over every pattern (policy sets with hundreds of path globs under one key exist).
///
/// The answer is the same as scanning the patterns sorted by literal prefix length
/// (descending), then declaration order, and taking the first that matches:
/// - patterns with a non-empty prefix are bucketed by that exact prefix; for each distinct
///   prefix length, longest first, only the bucket equal to the value's prefix of that length
///   can hold matches, and within it the first match in declaration order wins;
/// - patterns with an empty prefix (all tied at length 0) are bucketed by their suffix; the
///   match declared first wins, so the smallest matching index over the buckets is taken.
#[derive(Debug, Default)]
struct Wildcards {
    /// Declaration order.
    all: Vec<Wildcard>,
    /// Non-empty prefix -> indices into `all`, ascending.
    by_prefix: HashMap<Box<[u8]>, Vec<usize>>,
    /// Distinct non-empty prefix lengths, descending.
    prefix_lens: Vec<usize>,
    /// Empty prefix: suffix (maybe empty) -> indices into `all`, ascending.
    by_suffix: HashMap<Box<[u8]>, Vec<usize>>,
    /// Distinct suffix lengths of the empty-prefix patterns.
    suffix_lens: Vec<usize>,
}

impl Wildcards {
    fn contains_pattern(&self, pattern: &str) -> bool {
        self.all.iter().any(|w| w.parts.join("*") == pattern)
    }

    fn push(&mut self, w: Wildcard) {
        let index = self.all.len();
        let (prefix, suffix) = (w.prefix().as_bytes(), w.suffix().as_bytes());
        let (prefix, suffix): (Box<[u8]>, Box<[u8]>) = (prefix.into(), suffix.into());
        self.all.push(w);
        if prefix.is_empty() {
            if !self.suffix_lens.contains(&suffix.len()) {
                self.suffix_lens.push(suffix.len());
            }
            self.by_suffix.entry(suffix).or_default().push(index);
        } else {
            if let Err(at) = self.prefix_lens.binary_search_by(|l| prefix.len().cmp(l)) {
                self.prefix_lens.insert(at, prefix.len());
            }
            self.by_prefix.entry(prefix).or_default().push(index);
        }
    }

    fn find(&self, value: &[u8]) -> Option<NodeId> {
        if self.all.is_empty() {
            return None;
        }
        for &len in &self.prefix_lens {
            // A cut inside a multi-byte character is not UTF-8, so it equals no prefix.
            let Some(bucket) = value.get(..len).and_then(|p| self.by_prefix.get(p)) else {
                continue;
            };
            if let Some(w) = bucket
                .iter()
                .map(|&i| &self.all[i])
                .find(|w| w.matches(value))
            {
                return Some(w.node);
            }
        }
        let mut first: Option<usize> = None;
        for &len in &self.suffix_lens {
            let Some(bucket) = value
                .len()
                .checked_sub(len)
                .and_then(|at| value.get(at..))
                .and_then(|s| self.by_suffix.get(s))
            else {
                continue;
            };
            if let Some(&i) = bucket.iter().find(|&&i| self.all[i].matches(value)) {
                first = Some(first.map_or(i, |f| f.min(i)));
            }
        }
        first.map(|i| self.all[i].node)
    }

    /// The definition the index must agree with: a scan in precedence order.
    #[cfg(test)]
    fn find_by_scan(&self, value: &[u8]) -> Option<NodeId> {
        let mut order: Vec<&Wildcard> = self.all.iter().collect();
        // Stable: ties keep declaration order.
        order.sort_by_key(|w| std::cmp::Reverse(w.prefix().len()));
        order.into_iter().find(|w| w.matches(value)).map(|w| w.node)
    }
}

#[derive(Debug)]
struct Wildcard {
    /// Literal text between the `*`s; at least two parts (prefix and suffix, maybe empty).
    parts: Box<[Box<str>]>,
    literal_len: usize,
    node: NodeId,
}

impl Wildcard {
    fn compile(pattern: &str, node: NodeId) -> Self {
        let parts: Box<[Box<str>]> = pattern.split('*').map(Box::from).collect();
        let literal_len = parts.iter().map(|p| p.len()).sum();
        Wildcard {
            parts,
            literal_len,
            node,
        }
    }

    fn prefix(&self) -> &str {
        self.parts.first().map_or("", |p| p)
    }

    fn suffix(&self) -> &str {
        self.parts.last().map_or("", |p| p)
    }

    fn matches(&self, value: &[u8]) -> bool {
        let (Some(first), Some(last)) = (self.parts.first(), self.parts.last()) else {
            return false;
        };
        // Length first: it guarantees prefix and suffix do not overlap.
        if value.len() < self.literal_len
            || !value.starts_with(first.as_bytes())
            || !value.ends_with(last.as_bytes())
        {
            return false;
        }
        let Some(mut rest) = value.get(first.len()..value.len().saturating_sub(last.len())) else {
            return false;
        };
        let middle = self
            .parts
            .get(1..self.parts.len().saturating_sub(1))
            .unwrap_or(&[]);
        for part in middle {
            // Leftmost match is optimal for `*`-only globs: it leaves the most text for the rest.
            match find_bytes(rest, part.as_bytes()) {
                Some(at) => rest = rest.get(at + part.len()..).unwrap_or_default(),
                None => return false,
            }
        }
        true
    }
}

/// Position of the first occurrence of `needle` in `haystack`. Parts are short literals from
/// policy files; a naive search is linear enough and needs no dependency.
fn find_bytes(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return Some(0);
    }
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[derive(Debug)]
struct TreeNode {
    rule: usize,
    children: Level,
}

/// All domains' descriptor trees.
#[derive(Debug, Default)]
pub(crate) struct Matcher {
    domains: HashMap<Box<str>, Level>,
    nodes: Vec<TreeNode>,
}

/// Why a descriptor could not be inserted.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Duplicate;

impl Matcher {
    /// Adds a descriptor under `parent` (or at the domain's top level) and returns its node.
    pub(crate) fn insert(
        &mut self,
        domain: &str,
        parent: Option<NodeId>,
        key: &str,
        value: Option<&str>,
        rule: usize,
    ) -> Result<NodeId, Duplicate> {
        let id = self.nodes.len();
        let level = match parent {
            None => self.domains.entry(Box::from(domain)).or_default(),
            Some(p) => match self.nodes.get_mut(p) {
                Some(node) => &mut node.children,
                None => return Err(Duplicate),
            },
        };
        let entry = level.keys.entry(Box::from(key.as_bytes())).or_default();
        match value {
            None if entry.any.is_some() => return Err(Duplicate),
            None => entry.any = Some(id),
            Some(v) if v.contains('*') => {
                if entry.wildcards.contains_pattern(v) {
                    return Err(Duplicate);
                }
                entry.wildcards.push(Wildcard::compile(v, id));
            }
            Some(v) => match entry.exact.entry(Box::from(v.as_bytes())) {
                Entry::Occupied(_) => return Err(Duplicate),
                Entry::Vacant(slot) => {
                    slot.insert(id);
                }
            },
        }
        self.nodes.push(TreeNode {
            rule,
            children: Level::default(),
        });
        Ok(id)
    }

    /// The rule reached by consuming every entry, one level each; `None` for no entries or
    /// no match.
    pub(crate) fn find<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        domain: &str,
        entries: impl IntoIterator<Item = (K, V)>,
    ) -> Option<usize> {
        let mut level = self.domains.get(domain)?;
        let mut reached = None;
        for (key, value) in entries {
            let value = value.as_ref();
            let entry = level.keys.get(key.as_ref())?;
            let id = entry
                .exact
                .get(value)
                .copied()
                .or_else(|| entry.wildcards.find(value))
                .or(entry.any)?;
            let node = self.nodes.get(id)?;
            level = &node.children;
            reached = Some(node.rule);
        }
        reached
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The index answers exactly what a scan in precedence order answers.
        #[test]
        fn wildcard_index_agrees_with_the_precedence_scan(
            patterns in proptest::collection::vec("[ab/é]{0,3}\\*[ab/é*]{0,4}", 1..24),
            values in proptest::collection::vec("[ab/é]{0,8}", 1..24),
        ) {
            let mut w = Wildcards::default();
            for (node, p) in patterns.iter().enumerate() {
                if !w.contains_pattern(p) {
                    w.push(Wildcard::compile(p, node));
                }
            }
            for v in &values {
                prop_assert_eq!(w.find(v.as_bytes()), w.find_by_scan(v.as_bytes()), "value {:?}", v);
            }
        }
    }

    fn glob(p: &str, v: &str) -> bool {
        Wildcard::compile(p, 0).matches(v.as_bytes())
    }

    #[test]
    fn globs() {
        assert!(glob("/api/*", "/api/"));
        assert!(glob("/api/*", "/api/users/1"));
        assert!(!glob("/api/*", "/ap"));
        assert!(glob("*.png", "a.png"));
        assert!(!glob("*.png", "a.jpg"));
        assert!(glob("a*b", "ab"));
        assert!(glob("a*b", "axxb"));
        assert!(!glob("a*b", "a"), "prefix and suffix must not overlap");
        assert!(!glob("aa*aa", "aaa"));
        assert!(glob("*", ""));
        assert!(glob("a*b*c", "a-b-b-c"));
        assert!(!glob("a*b*c", "a-c-b"));
        assert!(glob("*é*", "xéy"), "multi-byte literals");
    }

    #[test]
    fn precedence_and_depth() {
        let mut m = Matcher::default();
        let any = m.insert("d", None, "k", None, 0).unwrap();
        m.insert("d", None, "k", Some("/a/*"), 1).unwrap();
        m.insert("d", None, "k", Some("/a/b/*"), 2).unwrap();
        m.insert("d", None, "k", Some("/a/b/c"), 3).unwrap();
        m.insert("d", None, "k", Some("*x"), 4).unwrap();
        m.insert("d", Some(any), "n", None, 5).unwrap();
        assert_eq!(m.find("d", [("k", "/a/b/c")]), Some(3));
        assert_eq!(m.find("d", [("k", "/a/b/d")]), Some(2), "longest prefix");
        assert_eq!(m.find("d", [("k", "/a/z")]), Some(1));
        assert_eq!(m.find("d", [("k", "zzx")]), Some(4));
        assert_eq!(
            m.find("d", [("k", "/a/x")]),
            Some(1),
            "prefix 3 beats prefix 0"
        );
        assert_eq!(m.find("d", [("k", "other")]), Some(0));
        assert_eq!(m.find("d", [("k", "other"), ("n", "v")]), Some(5));
        assert_eq!(
            m.find("d", [("k", "/a/z"), ("n", "v")]),
            None,
            "no backtracking"
        );
        assert_eq!(m.find("d", [] as [(&str, &str); 0]), None);
        assert_eq!(m.find("e", [("k", "x")]), None);
        assert_eq!(m.insert("d", None, "k", Some("/a/*"), 9), Err(Duplicate));
        assert_eq!(m.insert("d", None, "k", None, 9), Err(Duplicate));
        assert_eq!(m.insert("d", None, "k", Some("/a/b/c"), 9), Err(Duplicate));
    }

    proptest! {
        /// Any byte string is matched, never refused: the index agrees with the scan on
        /// values that are not UTF-8 too.
        #[test]
        fn arbitrary_bytes_agree_with_the_scan(
            patterns in proptest::collection::vec("[ab/é]{0,3}\\*[ab/é*]{0,4}", 1..12),
            values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..10), 1..24),
        ) {
            let mut w = Wildcards::default();
            for (node, p) in patterns.iter().enumerate() {
                if !w.contains_pattern(p) {
                    w.push(Wildcard::compile(p, node));
                }
            }
            for v in &values {
                prop_assert_eq!(w.find(v), w.find_by_scan(v), "value {:?}", v);
            }
        }
    }

    #[test]
    fn values_that_are_not_utf8_match_byte_for_byte() {
        let mut m = Matcher::default();
        let any = m.insert("d", None, "k", None, 0).unwrap();
        m.insert("d", None, "k", Some("/a/*"), 1).unwrap();
        m.insert("d", None, "k", Some("x"), 2).unwrap();
        m.insert("d", Some(any), "n", Some("*z"), 3).unwrap();
        let bad: &[u8] = b"/a/\xff\xfe";
        assert_eq!(m.find("d", [(&b"k"[..], bad)]), Some(1), "prefix on bytes");
        assert_eq!(
            m.find("d", [(&b"k"[..], &b"\xffx"[..])]),
            Some(0),
            "key-only"
        );
        assert_eq!(
            m.find("d", [(&b"k"[..], &b"\xc3"[..]), (&b"n"[..], &b"\x80z"[..])]),
            Some(3)
        );
        assert_eq!(m.find("d", [(&b"\xffk"[..], &b"x"[..])]), None, "keys too");
    }

    #[test]
    fn equal_prefixes_keep_declaration_order() {
        let mut m = Matcher::default();
        m.insert("d", None, "k", Some("a*x"), 0).unwrap();
        m.insert("d", None, "k", Some("a*"), 1).unwrap();
        assert_eq!(m.find("d", [("k", "abx")]), Some(0));
        assert_eq!(m.find("d", [("k", "aby")]), Some(1));
    }
}
