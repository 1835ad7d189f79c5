// third_party holds source releases of the tools the tests build (no Go
// code). A module of its own keeps them out of lockhooks' module zip, so
// users who fetch lockhooks do not download them.
module github.com/lockhooks/lockhooks/third_party

go 1.26.8
