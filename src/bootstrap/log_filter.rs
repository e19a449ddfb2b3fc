//! Validation of a log filter (`log.level`, `EDGELIMIT_LOG`). `tracing`'s own parser takes a
//! bare word as a target name, so `warning`, `verbose` or a typo would be a filter that
//! matches no target and silences every line, Redis failures and refused reloads included.
//! Here every directive must end in a level: `info`, `warn,edgelimit=debug`, `h2=off`.

const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// Checks `filter`; the error names the directive and what was expected.
pub fn validate(filter: &str) -> Result<(), String> {
    if filter.trim().is_empty() {
        return Err(format!(
            "must not be empty (one of {}, or target=level directives)",
            LEVELS.join(", ")
        ));
    }
    for directive in filter.split(',').map(str::trim) {
        let level = directive.rsplit_once('=').map_or(directive, |(_, l)| l);
        if !LEVELS.iter().any(|l| l.eq_ignore_ascii_case(level)) {
            return Err(format!(
                "`{directive}` does not end in a level (one of {}; a target is written target=level)",
                LEVELS.join(", ")
            ));
        }
    }
    tracing_subscriber::EnvFilter::try_new(filter)
        .map(drop)
        .map_err(|e| format!("`{filter}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_target_directives_pass() {
        for ok in [
            "info",
            "WARN",
            "off",
            "warn,edgelimit=debug",
            "h2=off, info",
        ] {
            assert_eq!(validate(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn typos_and_bare_words_fail_with_the_directive_named() {
        for bad in [
            "warning",
            "verbose",
            "",
            " ",
            "info,edgelimt",
            "edgelimit=loud",
        ] {
            let err = validate(bad).unwrap_err();
            assert!(err.contains("level"), "{bad}: {err}");
        }
        assert!(validate("warning").unwrap_err().contains("`warning`"));
    }
}
