//! Decodes one file's spanned YAML tree into a validated domain configuration: the
//! envoyproxy/ratelimit format plus edgelimit's `rate_limit` extensions. Every problem is
//! collected with its location; nothing here touches identity or the contract.

use std::collections::HashMap;
use std::path::Path;

use saphyr_parser::ScalarStyle;

use super::error::ConfigError;
use super::model::Unit;
use super::yaml::{Node, Pos, Scalar};
use edgelimit_contract::{Algorithm, MAX_EXACT_INTEGER};

/// One file's domain.
#[derive(Debug, Clone)]
pub(crate) struct DomainConfig {
    pub domain: String,
    pub pos: Pos,
    pub descriptors: Vec<DescriptorConfig>,
}

/// One `descriptors[]` entry, validated.
#[derive(Debug, Clone)]
pub(crate) struct DescriptorConfig {
    pub key: String,
    /// `None` matches any value; an empty `value` is treated as absent, as the reference does.
    pub value: Option<String>,
    pub pos: Pos,
    /// Field path of this descriptor, e.g. `descriptors[0].descriptors[2]`.
    pub field: String,
    pub limits: Vec<LimitConfig>,
    pub unlimited: bool,
    /// `rate_limit.name` of an unlimited rule (limits carry their own names).
    pub unlimited_name: Option<String>,
    /// Names from `replaces` at descriptor level and inside `rate_limit(s)`.
    pub replaces: Vec<String>,
    pub shadow_mode: bool,
    /// Reference `quota_mode`: over limit only if every quota descriptor of the request is.
    pub quota_mode: bool,
    pub detailed_metric: bool,
    /// Reference `value_to_metric`: accepted; metrics never carry values (see README).
    pub value_to_metric: bool,
    /// Reference `share_threshold`: every value matching this wildcard shares one counter.
    pub share_threshold: bool,
    pub children: Vec<DescriptorConfig>,
}

/// One limit, before it becomes a contract policy.
#[derive(Debug, Clone)]
pub(crate) struct LimitConfig {
    pub name: Option<String>,
    pub name_pos: Option<Pos>,
    pub requests_per_unit: u64,
    /// The unit Envoy is told about.
    pub unit: Unit,
    pub window_ms: u64,
    pub algorithm: Algorithm,
    /// Token bucket capacity; `None` means `requests_per_unit`.
    pub burst: Option<u64>,
    pub max_cost: Option<u64>,
    pub pos: Pos,
    pub field: String,
}

enum Parsed {
    Limit(LimitConfig),
    Unlimited { name: Option<String> },
}

/// One `replaces[].name`, kept with its place so a self-replacement can be reported there.
#[derive(Debug, Clone)]
struct Replace {
    name: String,
    pos: Pos,
    field: String,
}

const TOP_FIELDS: &[&str] = &["domain", "descriptors"];
const DESCRIPTOR_FIELDS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "rate_limits",
    "replaces",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    "descriptors",
];
const LIMIT_FIELDS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
    "burst",
    "unit_multiplier",
    "window",
    "max_cost",
];
const REPLACES_FIELDS: &[&str] = &["name"];

/// Decodes a file's root node. Invalid descriptors and limits are reported and left out,
/// so the rest of the file can still be checked (ids, contract ranges) and every error of
/// the set reported at once; `None` only when the file has no usable domain.
pub(crate) fn decode(
    file: &Path,
    root: &Node,
    max_depth: usize,
    errors: &mut Vec<ConfigError>,
) -> Option<DomainConfig> {
    let mut ctx = Ctx {
        file,
        errors,
        max_depth,
    };
    ctx.top(root)
}

struct Ctx<'a> {
    file: &'a Path,
    errors: &'a mut Vec<ConfigError>,
    max_depth: usize,
}

/// A mapping's fields, looked up by name; null values count as absent.
struct Fields<'n> {
    entries: Vec<(&'n Scalar, &'n Node)>,
    pos: Pos,
}

impl<'n> Fields<'n> {
    fn get(&self, name: &str) -> Option<&'n Node> {
        self.entries
            .iter()
            .find(|(k, v)| k.text == name && !v.is_null())
            .map(|(_, v)| *v)
    }
}

fn join(field: &str, name: &str) -> String {
    if field.is_empty() {
        name.to_string()
    } else {
        format!("{field}.{name}")
    }
}

impl Ctx<'_> {
    fn err(&mut self, pos: Pos, field: &str, message: impl Into<String>) {
        let field = if field.is_empty() {
            "(document)"
        } else {
            field
        };
        self.errors.push(ConfigError::new(
            self.file, pos.line, pos.column, field, message,
        ));
    }

    fn top(&mut self, root: &Node) -> Option<DomainConfig> {
        let fields = self.mapping(root, "", TOP_FIELDS)?;
        let domain = match fields.get("domain") {
            Some(node) => self.non_empty(node, "domain"),
            None => {
                self.err(fields.pos, "domain", "missing required field `domain`");
                None
            }
        };
        // Decoded even without a domain, so its errors are reported in the same pass.
        let descriptors = self.descriptor_list(fields.get("descriptors"), "", 1);
        Some(DomainConfig {
            domain: domain?,
            pos: fields.pos,
            descriptors,
        })
    }

    fn descriptor_list(
        &mut self,
        node: Option<&Node>,
        parent: &str,
        depth: usize,
    ) -> Vec<DescriptorConfig> {
        let field = join(parent, "descriptors");
        let Some(items) = node.and_then(|n| self.sequence(n, &field)) else {
            return Vec::new();
        };
        if depth > self.max_depth {
            let pos = node.map(Node::pos).unwrap_or(Pos { line: 1, column: 1 });
            self.err(
                pos,
                &field,
                format!(
                    "descriptors are nested deeper than {} levels",
                    self.max_depth
                ),
            );
            return Vec::new();
        }
        let mut out: Vec<DescriptorConfig> = Vec::with_capacity(items.len());
        let mut seen: HashMap<(String, Option<String>), usize> = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            let item_field = format!("{field}[{i}]");
            let Some(descriptor) = self.descriptor(item, &item_field, depth) else {
                continue;
            };
            let id = (descriptor.key.clone(), descriptor.value.clone());
            if let Some(first) = seen.get(&id) {
                let what = match &descriptor.value {
                    Some(v) => format!("key `{}` with value `{v}`", descriptor.key),
                    None => format!("key `{}` without a value", descriptor.key),
                };
                self.err(
                    descriptor.pos,
                    &item_field,
                    format!("duplicate descriptor: {what} is already defined at line {first}"),
                );
                continue;
            }
            seen.insert(id, descriptor.pos.line);
            out.push(descriptor);
        }
        out
    }

    fn descriptor(&mut self, node: &Node, field: &str, depth: usize) -> Option<DescriptorConfig> {
        let fields = self.mapping(node, field, DESCRIPTOR_FIELDS)?;
        let key = match fields.get("key") {
            Some(n) => self.non_empty(n, &join(field, "key")),
            None => {
                self.err(fields.pos, field, "missing required field `key`");
                None
            }
        };
        let value = fields
            .get("value")
            .and_then(|n| self.string(n, &join(field, "value")))
            .filter(|v| !v.is_empty());
        let shadow_mode = self.flag(&fields, field, "shadow_mode");
        let quota_mode = self.flag(&fields, field, "quota_mode");
        let detailed_metric = self.flag(&fields, field, "detailed_metric");
        let value_to_metric = self.flag(&fields, field, "value_to_metric");
        let share_threshold = self.flag(&fields, field, "share_threshold");
        if share_threshold && !value.as_deref().is_some_and(|v| v.contains('*')) {
            let at = fields.get("share_threshold").map_or(fields.pos, Node::pos);
            self.err(
                at,
                &join(field, "share_threshold"),
                "`share_threshold: true` needs a wildcard `value` (containing `*`)",
            );
        }
        if let Some(meta) = fields.get("metadata") {
            // Free-form in the reference (returned as dynamic metadata); only its shape is
            // checked here.
            if !matches!(meta, Node::Mapping(..)) {
                self.err(
                    meta.pos(),
                    &join(field, "metadata"),
                    format!("expected a mapping, found {}", meta.kind()),
                );
            }
        }

        let mut replaces: Vec<Replace> = Vec::new();
        let mut limits = Vec::new();
        let mut unlimited = false;
        let mut unlimited_name = None;
        let single = fields.get("rate_limit");
        let list = fields.get("rate_limits");
        if let (Some(_), Some(list)) = (single, list) {
            self.err(
                list.pos(),
                &join(field, "rate_limits"),
                "`rate_limits` cannot be combined with `rate_limit`; list every limit under `rate_limits`",
            );
        } else if let Some(node) = single {
            match self.limit(node, &join(field, "rate_limit"), &mut replaces) {
                Some(Parsed::Limit(l)) => limits.push(l),
                Some(Parsed::Unlimited { name }) => {
                    unlimited = true;
                    unlimited_name = name;
                }
                None => {}
            }
        } else if let Some(node) = list {
            let list_field = join(field, "rate_limits");
            if let Some(items) = self.sequence(node, &list_field) {
                if items.is_empty() {
                    self.err(node.pos(), &list_field, "expected at least one limit");
                }
                for (i, item) in items.iter().enumerate() {
                    let item_field = format!("{list_field}[{i}]");
                    match self.limit(item, &item_field, &mut replaces) {
                        Some(Parsed::Limit(l)) => limits.push(l),
                        Some(Parsed::Unlimited { name }) if items.len() == 1 => {
                            unlimited = true;
                            unlimited_name = name;
                        }
                        Some(Parsed::Unlimited { .. }) => self.err(
                            item.pos(),
                            &item_field,
                            "`unlimited: true` cannot be combined with other limits on one descriptor",
                        ),
                        None => {}
                    }
                }
            }
        }

        if let Some(n) = fields.get("replaces") {
            self.replaces(n, &join(field, "replaces"), &mut replaces);
        }
        // The reference rejects a rule naming itself: it would silently disable itself.
        let own: Vec<&str> = limits
            .iter()
            .filter_map(|l| l.name.as_deref())
            .chain(unlimited_name.as_deref())
            .collect();
        for r in &replaces {
            if own.contains(&r.name.as_str()) {
                self.err(
                    r.pos,
                    &r.field,
                    format!(
                        "a rule cannot replace itself: `{}` is the name of this descriptor's own limit",
                        r.name
                    ),
                );
            }
        }
        let replaces = replaces.into_iter().map(|r| r.name).collect();
        let children = self.descriptor_list(fields.get("descriptors"), field, depth + 1);
        Some(DescriptorConfig {
            key: key?,
            value,
            pos: fields.pos,
            field: field.to_string(),
            limits,
            unlimited,
            unlimited_name,
            replaces,
            shadow_mode,
            quota_mode,
            detailed_metric,
            value_to_metric,
            share_threshold,
            children,
        })
    }

    fn replaces(&mut self, node: &Node, field: &str, names: &mut Vec<Replace>) {
        let Some(items) = self.sequence(node, field) else {
            return;
        };
        for (i, item) in items.iter().enumerate() {
            let item_field = format!("{field}[{i}]");
            let Some(fields) = self.mapping(item, &item_field, REPLACES_FIELDS) else {
                continue;
            };
            match fields.get("name") {
                Some(n) => {
                    let name_field = join(&item_field, "name");
                    if let Some(name) = self.non_empty(n, &name_field) {
                        names.push(Replace {
                            name,
                            pos: n.pos(),
                            field: name_field,
                        });
                    }
                }
                None => self.err(fields.pos, &item_field, "missing required field `name`"),
            }
        }
    }

    fn limit(&mut self, node: &Node, field: &str, replaces: &mut Vec<Replace>) -> Option<Parsed> {
        let fields = self.mapping(node, field, LIMIT_FIELDS)?;
        let sub = |name: &str| join(field, name);
        // Where the reference's documentation puts it: `rate_limit: {replaces: [...]}`.
        if let Some(n) = fields.get("replaces") {
            self.replaces(n, &sub("replaces"), replaces);
        }
        let name = fields
            .get("name")
            .and_then(|n| self.non_empty(n, &sub("name")));
        let unlimited = self.flag(&fields, field, "unlimited");
        if unlimited {
            if let Some(unit) = fields.get("unit") {
                self.err(
                    unit.pos(),
                    &sub("unit"),
                    "a limit with `unlimited: true` must not have a `unit`",
                );
            }
            // `requests_per_unit` is ignored on unlimited rules, as in the reference; the
            // edgelimit extensions are new, so their presence is a mistake worth reporting.
            for ext in [
                "algorithm",
                "burst",
                "unit_multiplier",
                "window",
                "max_cost",
            ] {
                if let Some(n) = fields.get(ext) {
                    self.err(
                        n.pos(),
                        &sub(ext),
                        format!("`{ext}` cannot be combined with `unlimited: true`"),
                    );
                }
            }
            return Some(Parsed::Unlimited { name });
        }

        let algorithm = match fields.get("algorithm") {
            None => Some(Algorithm::FixedWindow),
            Some(n) => {
                let text = self.string(n, &sub("algorithm"))?;
                let parsed = [
                    Algorithm::FixedWindow,
                    Algorithm::SlidingWindow,
                    Algorithm::TokenBucket,
                ]
                .into_iter()
                .find(|a| a.as_str() == text);
                if parsed.is_none() {
                    self.err(
                        n.pos(),
                        &sub("algorithm"),
                        format!(
                            "unknown algorithm `{text}`; expected fixed_window, sliding_window or token_bucket"
                        ),
                    );
                }
                parsed
            }
        };
        let requests_per_unit = match fields.get("requests_per_unit") {
            // A missing count is a block rule, as in the reference.
            None => Some(0),
            Some(n) => self.integer(n, &sub("requests_per_unit")),
        };
        let burst = fields
            .get("burst")
            .map(|n| (n, self.integer(n, &sub("burst"))));
        let max_cost = fields
            .get("max_cost")
            .map(|n| (n, self.integer(n, &sub("max_cost"))));
        let window = self.window(&fields, field);

        if let (Some((n, _)), Some(a)) = (&burst, algorithm) {
            if a != Algorithm::TokenBucket {
                self.err(
                    n.pos(),
                    &sub("burst"),
                    "`burst` only applies to `algorithm: token_bucket`",
                );
            }
        }
        let burst = match burst {
            None => None,
            Some((_, None)) => return None,
            Some((_, Some(b))) => Some(b),
        };
        let max_cost = match max_cost {
            None => None,
            Some((n, Some(0))) => {
                self.err(n.pos(), &sub("max_cost"), "must be at least 1");
                return None;
            }
            Some((_, None)) => return None,
            Some((_, Some(c))) => Some(c),
        };
        let (unit, window_ms) = window?;
        Some(Parsed::Limit(LimitConfig {
            name,
            name_pos: fields.get("name").map(Node::pos),
            requests_per_unit: requests_per_unit?,
            unit,
            window_ms,
            algorithm: algorithm?,
            burst,
            max_cost,
            pos: fields.pos,
            field: field.to_string(),
        }))
    }

    /// The Envoy-facing unit and the window length, from `unit` (+ `unit_multiplier`) or
    /// `window`.
    fn window(&mut self, fields: &Fields<'_>, field: &str) -> Option<(Unit, u64)> {
        let sub = |name: &str| join(field, name);
        let unit = fields.get("unit");
        let multiplier = fields.get("unit_multiplier");
        if let Some(window) = fields.get("window") {
            if unit.is_some() || multiplier.is_some() {
                self.err(
                    window.pos(),
                    &sub("window"),
                    "`window` cannot be combined with `unit` or `unit_multiplier`",
                );
                return None;
            }
            let text = self.string(window, &sub("window"))?;
            let Some(ms) = parse_duration_ms(&text) else {
                self.err(
                    window.pos(),
                    &sub("window"),
                    format!("invalid window `{text}`; expected a positive whole number with a suffix s, m, h or d (e.g. `30s`)"),
                );
                return None;
            };
            return Some((largest_unit_dividing(ms), ms));
        }
        let Some(unit_node) = unit else {
            self.err(
                fields.pos,
                field,
                "missing `unit` (second, minute, hour, day, week, month or year) or `window`",
            );
            return None;
        };
        let text = self.string(unit_node, &sub("unit"))?;
        let Some(unit) = Unit::parse(&text) else {
            self.err(
                unit_node.pos(),
                &sub("unit"),
                format!("invalid unit `{text}`; expected second, minute, hour, day, week, month or year"),
            );
            return None;
        };
        let factor = match multiplier {
            None => 1,
            Some(n) => {
                let m = self.integer(n, &sub("unit_multiplier"))?;
                if m == 0 {
                    self.err(n.pos(), &sub("unit_multiplier"), "must be at least 1");
                    return None;
                }
                m
            }
        };
        match unit.millis().checked_mul(factor) {
            Some(ms) => Some((unit, ms)),
            None => {
                self.err(
                    fields.pos,
                    &sub("unit_multiplier"),
                    "the window (unit x unit_multiplier) is too long",
                );
                None
            }
        }
    }

    fn mapping<'n>(&mut self, node: &'n Node, field: &str, allowed: &[&str]) -> Option<Fields<'n>> {
        let Node::Mapping(entries, pos) = node else {
            self.err(
                node.pos(),
                field,
                format!("expected a mapping, found {}", node.kind()),
            );
            return None;
        };
        let mut fields = Vec::with_capacity(entries.len());
        for (key, value) in entries {
            if allowed.contains(&key.text.as_str()) {
                fields.push((key, value));
            } else {
                self.err(
                    key.pos,
                    &join(field, &key.text),
                    format!(
                        "unknown field `{}`; expected one of: {}",
                        key.text,
                        allowed.join(", ")
                    ),
                );
            }
        }
        Some(Fields {
            entries: fields,
            pos: *pos,
        })
    }

    fn sequence<'n>(&mut self, node: &'n Node, field: &str) -> Option<&'n [Node]> {
        match node {
            Node::Sequence(items, _) => Some(items),
            _ => {
                self.err(
                    node.pos(),
                    field,
                    format!("expected a list, found {}", node.kind()),
                );
                None
            }
        }
    }

    fn string(&mut self, node: &Node, field: &str) -> Option<String> {
        match node {
            Node::Scalar(s) => Some(s.text.clone()),
            _ => {
                self.err(
                    node.pos(),
                    field,
                    format!("expected a string, found {}", node.kind()),
                );
                None
            }
        }
    }

    fn non_empty(&mut self, node: &Node, field: &str) -> Option<String> {
        let text = self.string(node, field)?;
        if text.is_empty() {
            self.err(node.pos(), field, "must not be empty");
            return None;
        }
        Some(text)
    }

    fn integer(&mut self, node: &Node, field: &str) -> Option<u64> {
        let message = match node {
            Node::Scalar(s) if s.style == ScalarStyle::Plain => {
                let digits = s.text.strip_prefix('+').unwrap_or(&s.text);
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    format!("expected a non-negative whole number, found `{}`", s.text)
                } else {
                    match digits.parse::<u64>() {
                        Ok(n) if n <= MAX_EXACT_INTEGER => return Some(n),
                        // Beyond 2^53 - 1 the Redis programs could not count exactly.
                        _ => format!("`{}` is too large: at most {MAX_EXACT_INTEGER}", s.text),
                    }
                }
            }
            Node::Scalar(s) => format!(
                "expected a non-negative whole number, found quoted `{}` (remove the quotes)",
                s.text
            ),
            other => format!(
                "expected a non-negative whole number, found {}",
                other.kind()
            ),
        };
        self.err(node.pos(), field, message);
        None
    }

    /// An optional boolean field; absent or invalid is `false` (invalid is reported).
    fn flag(&mut self, fields: &Fields<'_>, parent: &str, name: &str) -> bool {
        let Some(node) = fields.get(name) else {
            return false;
        };
        match node {
            Node::Scalar(s) if s.style == ScalarStyle::Plain => match s.text.as_str() {
                "true" | "True" | "TRUE" => return true,
                "false" | "False" | "FALSE" => return false,
                _ => {}
            },
            _ => {}
        }
        let found = match node {
            Node::Scalar(s) => format!("`{}`", s.text),
            other => other.kind().to_string(),
        };
        self.err(
            node.pos(),
            &join(parent, name),
            format!("expected true or false, found {found}"),
        );
        false
    }
}

/// `30s`, `5m`, `1h`, `2d` → milliseconds. Windows are whole seconds or more: `ms` is refused.
pub(crate) fn parse_duration_ms(text: &str) -> Option<u64> {
    if text.ends_with("ms") || text.trim() != text {
        return None;
    }
    let ms = crate::duration::parse_duration(text).ok()?.as_millis();
    u64::try_from(ms).ok().filter(|ms| *ms > 0)
}

/// The unit Envoy is told about for a custom window: the largest one dividing it.
pub(crate) fn largest_unit_dividing(window_ms: u64) -> Unit {
    [
        Unit::Year,
        Unit::Month,
        Unit::Week,
        Unit::Day,
        Unit::Hour,
        Unit::Minute,
    ]
    .into_iter()
    .find(|u| window_ms % u.millis() == 0)
    .unwrap_or(Unit::Second)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("30s"), Some(30_000));
        assert_eq!(parse_duration_ms("5m"), Some(300_000));
        assert_eq!(parse_duration_ms("2h"), Some(7_200_000));
        assert_eq!(parse_duration_ms("1d"), Some(86_400_000));
        for bad in [
            "",
            "s",
            "0s",
            "10",
            "1.5s",
            "-1s",
            "1ms",
            "1 s",
            "99999999999999999999s",
        ] {
            assert_eq!(parse_duration_ms(bad), None, "{bad}");
        }
        assert_eq!(largest_unit_dividing(90_000), Unit::Second);
        assert_eq!(largest_unit_dividing(120_000), Unit::Minute);
        assert_eq!(largest_unit_dividing(14 * 86_400_000), Unit::Week);
    }
}
