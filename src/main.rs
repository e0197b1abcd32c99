fn main() -> std::process::ExitCode {
    ppl::cli::main()
}
