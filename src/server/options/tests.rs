use clap::Parser;

use super::*;
use crate::settings::{Cli, Command};

/// `Bounds::default()` (what tests and embedders get) is what the `serve` flags default to.
#[test]
fn default_bounds_are_the_flag_defaults() {
    let Command::Serve(settings) = Cli::parse_from(["floodgate", "serve", "--config", "x"]).command
    else {
        panic!("not serve");
    };
    assert_eq!(Bounds::from_settings(&settings.bounds), Bounds::default());
}
