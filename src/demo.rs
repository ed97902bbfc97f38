pub fn main(_args: &crate::cli::DemoArgs) -> i32 {
    0
}
