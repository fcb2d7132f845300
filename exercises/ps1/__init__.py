"""PS1, the numerics: the functions every algorithm file is made of, one per exercise."""
