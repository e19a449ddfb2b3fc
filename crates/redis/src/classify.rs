//! Failure certainty: which Redis errors prove nothing was mutated, and which leave it open.
//!
//! The rule is the seed's: `Unavailable` only when the command provably did not run (refused
//! before sending, or refused by the server before the program's first write);
//! `Indeterminate` whenever the command may have run and its reply was lost; `Incompatible`
//! when Redis answered with something this build does not understand. When in doubt between
//! "did not run" and "may have run", the answer is always "may have run".

use ::redis::{ErrorKind, RedisError, ServerErrorKind};

use edgelimit_contract::{IncompatibleCause, IndeterminateCause, UnavailableCause};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    Unavailable(UnavailableCause),
    Indeterminate(IndeterminateCause),
    Incompatible(IncompatibleCause),
}

/// Server error codes that Redis sends *instead of* running a command, or that a script gets
/// from its first write (the programs only read before their first `HSET`, and Redis 7 skips
/// OOM / READONLY / MISCONF checks once a script has written, so these can only stop a
/// program before it mutated anything).
const REFUSAL_CODES: &[&str] = &[
    "LOADING",
    "BUSY",
    "READONLY",
    "MASTERDOWN",
    "OOM",
    "NOPERM",
    "NOAUTH",
    "MISCONF",
    "NOREPLICAS",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MOVED",
    "ASK",
];

/// Classifies an error returned for a command that was handed to the connection.
///
/// Server error replies that Redis sends *instead of* running a script (LOADING, BUSY,
/// READONLY, MASTERDOWN, OOM, NOPERM, ...) prove the script did not run: unavailable.
/// Transport errors after dispatch may hide an executed script: indeterminate.
pub fn classify(error: &RedisError) -> Failure {
    match error.kind() {
        ErrorKind::Server(kind) => server(kind, error),
        ErrorKind::Extension => server_code(error.code().unwrap_or_default(), error),
        // The reply could not be decoded: the program ran (or not); what came back is not
        // something this build understands.
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => {
            Failure::Incompatible(IncompatibleCause::MalformedReply)
        }
        // Connection set-up failures: nothing was sent on a connection that never came up.
        ErrorKind::AuthenticationFailed
        | ErrorKind::InvalidClientConfig
        | ErrorKind::RESP3NotSupported => Failure::Unavailable(UnavailableCause::ConnectFailed),
        // A refused TCP connect happens before any byte of the command is written.
        ErrorKind::Io if error.is_connection_refusal() => {
            Failure::Unavailable(UnavailableCause::ConnectFailed)
        }
        ErrorKind::Io if error.is_timeout() => Failure::Indeterminate(IndeterminateCause::Timeout),
        // Broken pipe, reset, EOF: the multiplexer reports a connection that died before the
        // write and one that died before the reply alike, so this must be "may have run".
        ErrorKind::Io => Failure::Indeterminate(IndeterminateCause::ConnectionLost),
        _ => Failure::Indeterminate(IndeterminateCause::AfterDispatch),
    }
}

fn server(kind: ServerErrorKind, error: &RedisError) -> Failure {
    match kind {
        ServerErrorKind::BusyLoading
        | ServerErrorKind::ReadOnly
        | ServerErrorKind::MasterDown
        | ServerErrorKind::TryAgain
        | ServerErrorKind::ClusterDown
        | ServerErrorKind::NoPerm
        | ServerErrorKind::Moved
        | ServerErrorKind::Ask => Failure::Unavailable(UnavailableCause::ServerRefused),
        // NOSCRIPT is handled by the caller (one resend of the source); here it means the
        // resend itself was refused, which a working Redis never does.
        ServerErrorKind::NoScript | ServerErrorKind::CrossSlot => {
            Failure::Incompatible(IncompatibleCause::ProgramError)
        }
        _ => response_error(error),
    }
}

fn server_code(code: &str, error: &RedisError) -> Failure {
    if code == "WRONGTYPE" {
        Failure::Incompatible(IncompatibleCause::WrongType)
    } else if REFUSAL_CODES.contains(&code) {
        Failure::Unavailable(UnavailableCause::ServerRefused)
    } else {
        response_error(error)
    }
}

/// `ERR ...` replies: a script that failed while running, or a wrong-typed key. The programs
/// check the key type before any write, so these are program/state mismatches.
fn response_error(error: &RedisError) -> Failure {
    let detail = error.detail().unwrap_or_default();
    if error.code() == Some("WRONGTYPE") || detail.contains("WRONGTYPE") {
        Failure::Incompatible(IncompatibleCause::WrongType)
    } else {
        Failure::Incompatible(IncompatibleCause::ProgramError)
    }
}

/// Whether the connection that produced `error` can no longer be trusted and must be
/// replaced: transport failures, and undecodable replies (the stream may be out of step).
pub fn breaks_connection(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Io | ErrorKind::Parse | ErrorKind::AuthenticationFailed
    ) || error.is_unrecoverable_error()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::redis::Value;
    use std::io;

    /// A server error reply exactly as the parser produces it from `-CODE detail`.
    fn server_reply(line: &str) -> RedisError {
        let mut frame = Vec::from(b"-".as_slice());
        frame.extend_from_slice(line.as_bytes());
        frame.extend_from_slice(b"\r\n");
        match ::redis::parse_redis_value(&frame) {
            Ok(value @ Value::ServerError(_)) => match value.extract_error() {
                Err(error) => error,
                Ok(other) => panic!("not an error: {other:?}"),
            },
            other => panic!("unexpected parse of {line:?}: {other:?}"),
        }
    }

    const UNAVAILABLE: Failure = Failure::Unavailable(UnavailableCause::ServerRefused);

    #[test]
    fn refusals_before_running_are_unavailable() {
        for line in [
            "LOADING Redis is loading the dataset in memory",
            "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
            "READONLY You can't write against a read only replica. script: 1a2b, on @user_script:57.",
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
            "OOM command not allowed when used memory > 'maxmemory'. script: 1a2b, on @user_script:57.",
            "NOPERM User limited has no permissions to run the 'evalsha' command",
            "NOAUTH Authentication required.",
            "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.",
            "NOREPLICAS Not enough good replicas to write.",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CLUSTERDOWN The cluster is down",
            "MOVED 3999 127.0.0.1:6381",
            "ASK 3999 127.0.0.1:6381",
        ] {
            assert_eq!(classify(&server_reply(line)), UNAVAILABLE, "{line}");
        }
    }

    #[test]
    fn errors_while_running_are_incompatible() {
        assert_eq!(
            classify(&server_reply(
                "WRONGTYPE Operation against a key holding the wrong kind of value"
            )),
            Failure::Incompatible(IncompatibleCause::WrongType)
        );
        assert_eq!(
            classify(&server_reply(
                "ERR user_script:1: Script attempted to access nonexistent global variable 'x'"
            )),
            Failure::Incompatible(IncompatibleCause::ProgramError)
        );
        assert_eq!(
            classify(&server_reply("NOSCRIPT No matching script.")),
            Failure::Incompatible(IncompatibleCause::ProgramError),
            "NOSCRIPT after the one resend"
        );
        assert_eq!(
            classify(&server_reply("WHATEVER an error code from a future Redis")),
            Failure::Incompatible(IncompatibleCause::ProgramError)
        );
        let parse = RedisError::from((ErrorKind::Parse, "bad"));
        assert_eq!(
            classify(&parse),
            Failure::Incompatible(IncompatibleCause::MalformedReply)
        );
        assert!(breaks_connection(&parse));
    }

    #[test]
    fn transport_losses_are_indeterminate_refused_connects_unavailable() {
        let refused = RedisError::from(io::Error::from(io::ErrorKind::ConnectionRefused));
        assert_eq!(
            classify(&refused),
            Failure::Unavailable(UnavailableCause::ConnectFailed)
        );
        for kind in [
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::BrokenPipe,
            io::ErrorKind::UnexpectedEof,
            io::ErrorKind::ConnectionAborted,
        ] {
            let lost = RedisError::from(io::Error::from(kind));
            assert_eq!(
                classify(&lost),
                Failure::Indeterminate(IndeterminateCause::ConnectionLost),
                "{kind:?}"
            );
            assert!(breaks_connection(&lost), "{kind:?}");
        }
        let timeout = RedisError::from(io::Error::from(io::ErrorKind::TimedOut));
        assert_eq!(
            classify(&timeout),
            Failure::Indeterminate(IndeterminateCause::Timeout)
        );
        let auth = RedisError::from((ErrorKind::AuthenticationFailed, "bad password"));
        assert_eq!(
            classify(&auth),
            Failure::Unavailable(UnavailableCause::ConnectFailed)
        );
    }

    #[test]
    fn cluster_errors_after_retries() {
        // A cluster connection that gave up on a redirect or a busy slot returns the server's
        // error: the program did not run there.
        for line in [
            "MOVED 3999 127.0.0.1:6381",
            "ASK 3999 127.0.0.1:6381",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CLUSTERDOWN The cluster is down",
        ] {
            assert_eq!(classify(&server_reply(line)), UNAVAILABLE, "{line}");
        }
        // No connection to the slot's node after earlier attempts: one of them may have run.
        let lost = RedisError::from((ErrorKind::ClusterConnectionNotFound, "no connection"));
        assert!(matches!(classify(&lost), Failure::Indeterminate(_)));
    }

    #[test]
    fn server_refusals_keep_the_connection() {
        assert!(!breaks_connection(&server_reply("LOADING loading")));
        assert!(!breaks_connection(&server_reply("WRONGTYPE wrong")));
    }
}
