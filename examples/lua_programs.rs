//! Writes the composed Lua programs, exactly as the server sends them, into a directory (for
//! `redis-benchmark` in `bench/run.sh`, for review, or for `SCRIPT LOAD` by hand):
//!
//!     cargo run --example lua_programs -- target/lua
use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: lua_programs <directory>");
        return ExitCode::from(2);
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("{}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    for program in edgelimit::redis::Programs::load().all() {
        let path = dir.join(format!("{}.lua", program.name));
        if let Err(e) = std::fs::write(&path, program.source) {
            eprintln!("{}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("{} {}", program.sha, path.display());
    }
    ExitCode::SUCCESS
}
