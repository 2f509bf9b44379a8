import streamlit as st
st.title("Calculator")
st.write("placeholder")
