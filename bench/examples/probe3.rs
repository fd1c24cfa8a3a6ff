// Scratch: write candidate synthetic sets as .fvecs.
fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (n, dim, clusters): (usize, usize, usize) = (
        a[1].parse().unwrap(),
        a[2].parse().unwrap(),
        a[3].parse().unwrap(),
    );
    let ds = bench::data::synthetic(n, dim, clusters, 42);
    bench::data::write_fvecs(std::path::Path::new(&a[4]), &ds).unwrap();
}
