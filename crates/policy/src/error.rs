//! Located configuration errors. Every problem names the file, the 1-based line and column,
//! and the field path, so an operator can fix a whole set in one pass.

use std::fmt;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// One problem in one policy file.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{}:{line}:{column}: {field}: {message}", file.display())]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based; 0 when the problem is not tied to a position (I/O errors).
    pub line: usize,
    /// 1-based; 0 when the problem is not tied to a position.
    pub column: usize,
    /// Field path such as `descriptors[1].rate_limit.unit`; `(document)` or `(file)` when the
    /// problem concerns the whole document or file.
    pub field: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(
        file: &Path,
        line: usize,
        column: usize,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            file: file.to_path_buf(),
            line,
            column,
            field: field.into(),
            message: message.into(),
        }
    }

    /// A problem with the file itself (unreadable, too large, not UTF-8).
    pub fn file(file: &Path, message: impl Into<String>) -> Self {
        Self::new(file, 0, 0, "(file)", message)
    }
}

/// Every error found in a policy set; the set is rejected when this is non-empty.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    pub fn errors(&self) -> &[ConfigError] {
        &self.0
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} policy configuration error(s)", self.0.len())?;
        for error in &self.0 {
            write!(f, "\n  {error}")?;
        }
        Ok(())
    }
}
