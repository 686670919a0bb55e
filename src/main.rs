fn main() {
    println!("shardgate {}", env!("CARGO_PKG_VERSION"));
}
