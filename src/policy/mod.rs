//! Policy files: YAML in the envoyproxy/ratelimit format with edgelimit extensions.

mod error;
mod model;
#[allow(dead_code)] // used by the schema decoder in the next commit
mod yaml;

pub use error::{ConfigError, ConfigErrors};
pub use model::{Limit, Rule, Unit};
